"""The pipeline engines against one process on the same micro-steps (fp32, a 4-block tiny model):
torch.distributed.pipelining on 2 CPU ranks (gloo) under each schedule, and the threaded pipeline
(stage threads, here every stage on the CPU). One launch serves every multi-rank check."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kohakumoss.distributed import current
from kohakumoss.distributed.pipeline import (
    PipelineEngine,
    Prediction,
    capacities,
    stage_starts,
)
from kohakumoss.distributed.threaded import ThreadedEngine, spread_forward
from kohakumoss.model import MossBackbone, PackedSeq
from kohakumoss.train.step import draw_step_noise, flow_loss
from kohakumoss_kernels import OpSet

from . import helpers as h
from .knob_run import run_knobs
from .test_engines import adapter, close

CFG = dataclasses.replace(h.CFG, depth=4)
ALL = list(range(len(h.GRIDS)))
ACCUM = 2


def model(full: bool = False) -> MossBackbone:
    torch.manual_seed(0)
    m = MossBackbone(CFG, OpSet("eager", tune="off"))
    m.init_weights(std=0.05, generator=torch.Generator().manual_seed(0))
    return m.requires_grad_(full)


def draws(micro_step: int):
    batch = h.local_batch(ALL)
    sigma, noise = draw_step_noise(7, micro_step, batch.x0, batch.seq, h.TCFG)
    return batch, sigma, noise


def loss_over(forward, reduction: str = "token"):
    """The trainer's loss (train/trainer.py step_loss_fn) over `forward`."""
    return lambda batch, sigma, noise: flow_loss(
        forward, batch, sigma, noise, torch.float32, "none", reduction
    )


def one_process(full: bool, reduction: str = "token") -> tuple[list[float], dict]:
    """ACCUM micro-steps in one process: each micro-step's loss, the accumulated gradients."""
    m = model(full)
    net = None if full else adapter(m)
    losses = []
    for micro in range(ACCUM):
        loss = loss_over(m, reduction)(*draws(micro))
        (loss / ACCUM).backward()
        losses.append(float(loss.detach()))
    return losses, h.grads(m if full else net)


def pipelined(engine_of, full: bool) -> tuple[list[float], dict]:
    """ACCUM micro-steps through an engine: each micro-step's loss and every stage's gradients (under
    torch.distributed every rank's own stages' gradients, gathered: a stage's are its owner rank's)."""
    m = model(full)
    net = None if full else adapter(m)
    prediction = Prediction()
    engine = engine_of(m, net, loss_over(prediction), prediction)
    losses = [float(engine.run(*draws(micro))) for micro in range(ACCUM)]
    owned = getattr(engine, "owned", None)
    grads = {
        n: g
        for n, g in h.grads(m if full else net).items()
        if owned is None or id(dict((m if full else net).named_parameters())[n]) in owned
    }
    if owned is not None:
        parts = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(parts, grads)
        grads = {n: g for part in parts for n, g in part.items()}
    return losses, grads


def on_each_rank(k: dict) -> dict:
    world = current()
    out = {}
    for schedule, stages, full in (
        ("gpipe", 2, False),
        ("1f1b", 2, False),
        ("interleaved", 4, False),
        ("1f1b", 2, True),
    ):
        starts = stage_starts(CFG.depth, stages)
        capacity = capacities([h.items()], stages, max(h.TEXT))

        def engine_of(
            m, net, loss, prediction, starts=starts, schedule=schedule, stages=stages, capacity=capacity
        ):
            return PipelineEngine(
                m,
                net,
                world,
                starts,
                schedule,
                stages,
                capacity,
                torch.float32,
                loss,
                prediction,
                ACCUM,
                "token",
            )

        out[(schedule, full)] = pipelined(engine_of, full)
    return out


@pytest.fixture(scope="module")
def ranks():
    k = {"DISTRIBUTED": "pipeline", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": 60.0}
    return run_knobs(k, on_each_rank)


def same_step(result, full: bool) -> None:
    losses, grads = result
    ref_losses, ref_grads = one_process(full)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    close(grads, ref_grads, rtol=1e-4, atol=1e-6)  # every trainable weight's, none missing


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pipeline_losses_and_adapter_gradients_equal_one_process(ranks, schedule):
    same_step(ranks[(schedule, False)], full=False)


def test_pipeline_full_finetune_gradients_equal_one_process(ranks):
    same_step(ranks[("1f1b", True)], full=True)


def test_threaded_equals_one_process():
    for full in (False, True):

        def engine_of(m, net, loss, prediction):
            starts = stage_starts(CFG.depth, 3, [0, 1, 3])
            return ThreadedEngine(
                m, net, starts, ["cpu"] * 3, 3, torch.float32, loss, prediction, ACCUM, "token"
            )

        same_step(pipelined(engine_of, full), full)


def test_spread_forward_is_the_backbone_forward():
    """The backbone's own forward (the sampler's, with skip-layer guidance on leading samples) through
    the threaded stages' block-runner wrapper equals the plain forward; the wrapper leaves on exit."""
    m = model()
    net = adapter(m)
    batch, sigma, _ = draws(0)
    args = (batch.x0, batch.text, sigma, batch.seq)
    lead = PackedSeq.build(h.TEXT[:2], h.GRIDS[:2], torch.device("cpu"))
    with torch.no_grad():
        want = m(*args)
        want_skip = m(*args, skip_layers=(2,), keep_lead=lead)
        with spread_forward(m, net, stage_starts(CFG.depth, 3, [0, 1, 3]), ["cpu"] * 3):
            assert m.block_runner is not None  # every block goes through the wrapper
            got = m(*args)
            got_skip = m(*args, skip_layers=(2,), keep_lead=lead)
    assert m.block_runner is None
    assert torch.equal(got, want) and torch.equal(got_skip, want_skip)
    assert not torch.equal(want, want_skip)  # the skipped block changed the other samples
