"""DDP with GRAD_OFFLOAD on 2 GPUs: NCCL is the default group, the host sums are averaged over a second,
gloo group. The CPU tests' checks (test_host_grads.py), and the trainer under MEMORY_PROFILE 'minimal'
against one GPU. Skipped with fewer than 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.train.loop import train_on_devices

from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)
from . import test_host_grads as host
from .test_trainer import records

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]


def test_host_sums_averaged_over_a_gloo_group_beside_nccl():
    both = host.launch("cuda")
    assert [(o["backend"], o["own_group"]) for o in both] == [("nccl", True)] * 2
    host.check_ranks(both, "cuda")


@pytest.mark.parametrize("algo", ["lora", "full"])
def test_trainer_ddp_minimal_on_two_gpus_logs_the_losses_of_one(train_world, algo):  # noqa: F811
    base = dict(
        DEVICE="cuda", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf", SAVE_EVERY=2,
        MEMORY_PROFILE="minimal", ALGO=algo, USE_MUON=False, LR=1e-4 if algo == "full" else 1e-3,
    )  # fmt: skip
    one = train_on_devices(tiny_knobs(train_world, f"gpu-minimal-{algo}-one", **base))
    two = train_on_devices(
        tiny_knobs(train_world, f"gpu-minimal-{algo}-two", DISTRIBUTED="ddp", DEVICES=2, **base)
    )
    a, b = records(one), records(two)
    print(f"minimal {algo}: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    assert "averaged over 2 ranks in fp32 buckets (a gloo group)" in (two / "log.txt").read_text()
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-3)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-3)
    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, f"gpu-minimal-{algo}-at-one", RESUME=ckpt, **base))
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-3)
