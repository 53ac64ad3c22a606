"""The trainer with DISTRIBUTED='ddp' and host optimizer states (OPTIMIZER_PLACEMENT 'host', DDP averaging
the gradients on the device) on 2 CPU ranks: one copy of the masters per node (host_share.py), the
one-process losses and gradient norms (fp32), and its checkpoint resumed at world size 1 and 2."""

from __future__ import annotations

import pytest

from kohakumoss.train.loop import train_on_devices

from .test_trainer import records
from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf", OPTIMIZER_PLACEMENT="host")
CASES = {"lora-host": {}, "full-host": dict(ALGO="full", USE_MUON=False, LR=1e-4)}


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_with_node_shared_host_masters_trains_what_one_process_does(train_world, case):  # noqa: F811
    extra = {**STEPS, **CASES[case]}
    one = train_on_devices(tiny_knobs(train_world, f"{case}-one", **extra))
    two_k = tiny_knobs(train_world, f"{case}-two", DISTRIBUTED="ddp", DEVICES=2, SAVE_EVERY=2, **extra)
    two = train_on_devices(two_k)
    for log in ((two / "log.txt").read_text(), (two / "ranks" / "1" / "log.txt").read_text()):
        assert "host masters: 1 copy per node" in log and "shared by 2 ranks" in log, log
    assert "host masters" not in (one / "log.txt").read_text()
    a, b = records(one), records(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
    assert len({r["loss"] for r in b}) == 3  # the weights moved
    assert [r["loss"] for r in records(two / "ranks" / "1")] == [r["loss"] for r in b]

    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, f"{case}-resumed", RESUME=ckpt, **extra))
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-5)
    again = train_on_devices(
        tiny_knobs(train_world, f"{case}-again", RESUME=ckpt, DISTRIBUTED="ddp", DEVICES=2, **extra)
    )
    assert records(again)[0]["loss"] == pytest.approx(b[-1]["loss"], rel=1e-6)
