"""The trainer with DISTRIBUTED='ddp' and gradients summed on the host (GRAD_OFFLOAD, alone or from
MEMORY_PROFILE 'minimal') on 2 CPU ranks (gloo) against one process: the same losses and gradient norms
(fp32), and a 2-rank checkpoint resumed at world size 1 and 2."""

from __future__ import annotations

import pytest

from kohakumoss.train.loop import train_on_devices
from kohakumoss_common.errors import ConfigError

from .test_fsdp_trainer import same_losses
from .test_trainer import records
from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf")
CASES = {
    "lora-minimal": dict(MEMORY_PROFILE="minimal"),
    "full-minimal": dict(MEMORY_PROFILE="minimal", ALGO="full", USE_MUON=False, LR=1e-4),
    # GRAD_OFFLOAD alone (it needs host or streamed optimizer states): no streaming, no activation offload
    "lora-grad-offload": dict(MEMORY_PROFILE="speed", GRAD_OFFLOAD=True, OPTIMIZER_PLACEMENT="host"),
    "full-grad-offload": dict(
        MEMORY_PROFILE="speed",
        GRAD_OFFLOAD=True,
        OPTIMIZER_PLACEMENT="stream",
        ALGO="full",
        USE_MUON=False,
        LR=1e-4,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_with_host_summed_gradients_trains_what_one_process_does(train_world, case):  # noqa: F811
    extra = {**STEPS, **CASES[case]}
    one = train_on_devices(tiny_knobs(train_world, f"{case}-one", **extra))
    two_k = tiny_knobs(train_world, f"{case}-two", DISTRIBUTED="ddp", DEVICES=2, SAVE_EVERY=2, **extra)
    two = train_on_devices(two_k)
    log = (two / "log.txt").read_text()
    assert "DDP with GRAD_OFFLOAD:" in log and "averaged over 2 ranks" in log, log
    assert "host masters: 1 copy per node" in log, log  # host_share.py: the ranks share the masters
    a, b = records(one), records(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    same_losses(a, b, rel=1e-5, grad_rel=1e-4)
    assert len({r["loss"] for r in b}) == 3  # the weights moved
    assert [r["loss"] for r in records(two / "ranks" / "1")] == [r["loss"] for r in b]

    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, f"{case}-resumed", RESUME=ckpt, **extra))
    assert [r["step"] for r in records(resumed)] == [3]
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-5)
    again = train_on_devices(
        tiny_knobs(train_world, f"{case}-again", RESUME=ckpt, DISTRIBUTED="ddp", DEVICES=2, **extra)
    )
    assert records(again)[0]["loss"] == pytest.approx(b[-1]["loss"], rel=1e-6)


@pytest.mark.parametrize("mode", ["fsdp", "pipeline", "threaded"])
def test_grad_offload_still_refused_off_ddp_naming_the_knob(train_world, mode):  # noqa: F811
    devices = ["cpu", "cpu"] if mode == "threaded" else 2
    k = tiny_knobs(train_world, "no", DISTRIBUTED=mode, DEVICES=devices, GRAD_OFFLOAD=True)
    with pytest.raises(ConfigError, match=f"GRAD_OFFLOAD: True with DISTRIBUTED='{mode}'"):
        train_on_devices(k)
    # and resolved from the profile: refused by the plan check once the plan exists
    k = tiny_knobs(train_world, f"no-{mode}", DISTRIBUTED=mode, DEVICES=devices, MEMORY_PROFILE="minimal")
    with pytest.raises(
        Exception, match=rf"STREAM_BLOCKS: -1 with DISTRIBUTED='{mode}' \(from the memory plan"
    ):
        train_on_devices(k)
