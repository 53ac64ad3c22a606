"""The distributed engines on 2 GPUs (NCCL): the CPU tests' checks, on CUDA. Skipped with fewer GPUs."""

from __future__ import annotations

import time

import pytest
import torch

from kohakumoss.distributed import DistributedError
from kohakumoss.train.loop import train_on_devices

from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)
from . import test_engines as engines
from . import test_faults as faults
from .knob_run import run_knobs
from .test_trainer import records

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return engines.launch_ranks(tmp_path_factory.mktemp("dcp-gpu"), "cuda")


def test_two_nccl_ranks(ranks):
    out, _, _ = ranks
    assert (out["rank"], out["size"], out["backend"], out["device"]) == (0, 2, "nccl", "cuda:0")


def test_ddp_on_two_gpus_equals_one_gpu(ranks):
    engines.check_ddp(ranks[0], "cuda")


def test_fsdp2_equals_ddp_on_two_gpus(ranks):
    engines.check_fsdp(ranks[0])


def test_sharded_checkpoint_across_world_sizes_on_gpus(ranks):
    engines.check_dcp(*ranks, device="cuda")


def test_a_dead_gpu_rank_stops_the_other(capsys):
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cuda", "DIST_TIMEOUT": 20.0, "FAULT": "die"}
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1\b") as info:
        run_knobs(k, faults.steps_then)
    print(f"stopped after {time.monotonic() - t0:.1f} s: {info.value}")
    assert time.monotonic() - t0 < 120


def test_trainer_ddp_on_two_gpus_logs_the_losses_of_one(train_world):  # noqa: F811
    """The trainer end to end: DISTRIBUTED='ddp' on 2 GPUs against 1 GPU (fp32, eager ops, tiny model)."""
    base = dict(DEVICE="cuda", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf")
    one = train_on_devices(tiny_knobs(train_world, "gpu-one", **base))
    two = train_on_devices(tiny_knobs(train_world, "gpu-two", DISTRIBUTED="ddp", DEVICES=2, **base))
    a, b = records(one), records(two)
    print("one GPU:", [r["loss"] for r in a], "two GPUs:", [r["loss"] for r in b])
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-3)
        assert (rb["samples"], rb["tokens"]) == (ra["samples"], ra["tokens"])


@pytest.mark.parametrize("algo", ["lora", "full"])
def test_trainer_ddp_graphed_on_two_gpus_logs_the_losses_of_one(train_world, algo):  # noqa: F811
    """DDP with CUDA_GRAPHS='auto' (bf16): each rank captures and replays its micro-steps, the gradients
    averaged after the backward (no DDP wrapper); the losses within bf16 tolerance of one GPU's."""
    base = dict(DEVICE="cuda", PRECISION="bf16", OPS_BACKEND="auto", MEMORY_PROFILE="speed", STEPS=6)
    base.update(GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf", CUDA_GRAPHS="auto", ALGO=algo, USE_MUON=False)
    one = train_on_devices(tiny_knobs(train_world, f"gpu-graphed-{algo}-one", **base))
    two = train_on_devices(
        tiny_knobs(train_world, f"gpu-graphed-{algo}-two", DISTRIBUTED="ddp", DEVICES=2, **base)
    )
    log = (two / "log.txt").read_text()
    assert "CUDA graph captured" in log and "replayed" in log, log
    assert "gradients averaged over 2 ranks after the backward" in log and "CUDA graphs" in log
    a, b = records(one), records(two)
    print(f"graphed ddp {algo}: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    assert [r["step"] for r in b] == list(range(1, 7))
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=2e-2)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=5e-2)
        assert (rb["samples"], rb["tokens"]) == (ra["samples"], ra["tokens"])


@pytest.mark.parametrize("algo", ["lora", "full"])
def test_trainer_fsdp_on_two_gpus_logs_the_losses_of_one(train_world, algo):  # noqa: F811
    """DISTRIBUTED='fsdp' on 2 GPUs (NCCL) against 1 GPU, fp32 (eager ops, tiny model): the same losses;
    its sharded step-2 checkpoint resumed on 1 GPU gives the one-GPU run's step 3."""
    base = dict(DEVICE="cuda", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_EVERY=2, ALGO=algo, USE_MUON=False)
    one = train_on_devices(tiny_knobs(train_world, f"gpu-fsdp-{algo}-one", **base))
    fsdp = dict(DISTRIBUTED="fsdp", DEVICES=2)
    two = train_on_devices(tiny_knobs(train_world, f"gpu-fsdp-{algo}-two", **fsdp, **base))
    a, b = records(one), records(two)
    print(f"fsdp {algo}: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-3)
        assert (rb["samples"], rb["tokens"]) == (ra["samples"], ra["tokens"])
    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, f"gpu-fsdp-{algo}-at-one", RESUME=ckpt, **base))
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-3)


def test_trainer_fsdp_bf16_on_two_gpus(train_world):  # noqa: F811
    """Mixed precision as PRECISION: a bf16 full fine-tune (fp32 masters, Muon and AdamW on the shards)
    on 2 GPUs trains, its losses within bf16 tolerance of one GPU's."""
    base = dict(DEVICE="cuda", PRECISION="bf16", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], ALGO="full")
    one = train_on_devices(tiny_knobs(train_world, "gpu-fsdp-bf16-one", **base))
    two = train_on_devices(
        tiny_knobs(train_world, "gpu-fsdp-bf16-two", DISTRIBUTED="fsdp", DEVICES=2, **base)
    )
    a, b = records(one), records(two)
    print("fsdp bf16: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    assert "computing in torch.bfloat16" in (two / "log.txt").read_text()
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=2e-2)
