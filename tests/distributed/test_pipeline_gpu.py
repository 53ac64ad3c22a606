"""The pipeline engines on 2 GPUs (NCCL between ranks; the threaded one across cuda:0 and cuda:1): the
CPU tests' checks, on CUDA, against one process. Skipped with fewer than 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.distributed import run
from kohakumoss.distributed.pipeline import stage_starts
from kohakumoss.distributed.threaded import ThreadedEngine
from kohakumoss.distributed.trainer import on_devices
from kohakumoss.train.loop import train

from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)
from . import test_pipeline as tp
from .test_engines import close
from .test_fsdp_trainer import same_losses
from .test_trainer import records

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]

train_on_devices = on_devices(train)  # what scripts/train/moss.py runs


def near(result, full: bool) -> None:
    """The stages ran on GPUs, the reference on the CPU: fp32 within GPU tolerance."""
    losses, grads = result
    ref_losses, ref_grads = tp.one_process(full)
    print("pipeline:", losses, "one process:", ref_losses)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    close(grads, ref_grads, rtol=1e-3, atol=1e-5)


@pytest.fixture(scope="module")
def ranks():
    k = {"DISTRIBUTED": "pipeline", "DEVICES": 2, "DEVICE": "cuda", "DIST_TIMEOUT": 120.0}
    return run(k, tp.on_each_rank)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pipeline_on_two_gpus_equals_one_process(ranks, schedule):
    near(ranks[(schedule, False)], full=False)


def test_pipeline_full_finetune_on_two_gpus_equals_one_process(ranks):
    near(ranks[("1f1b", True)], full=True)


def test_threaded_on_two_gpus_equals_one_process():
    for full in (False, True):

        def engine_of(m, net, loss, prediction):
            starts = stage_starts(tp.CFG.depth, 2)
            return ThreadedEngine(
                m, net, starts, ["cuda:0", "cuda:1"], 2, torch.float32, loss, prediction, tp.ACCUM, "token"
            )

        near(tp.pipelined(engine_of, full), full)


@pytest.mark.parametrize(
    "mode", [dict(DISTRIBUTED="pipeline", DEVICES=2), dict(DISTRIBUTED="threaded", DEVICES=[0, 1])]
)
def test_trainer_pipelines_on_two_gpus_log_the_losses_of_one(train_world, mode):  # noqa: F811
    """The trainer end to end (fp32, eager ops, tiny model) against one GPU."""
    base = dict(DEVICE="cuda", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="both", SAVE_EVERY=2)
    name = mode["DISTRIBUTED"]
    one = train_on_devices(tiny_knobs(train_world, f"gpu-{name}-one", **base))
    two = train_on_devices(tiny_knobs(train_world, f"gpu-{name}-two", **mode, **base))
    a, b = records(one), records(two)
    print(f"{name}: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    same_losses(a, b, rel=1e-3)
