"""RankRun's phases one at a time, without a process group: one process gets every piece back as it gave
it (no hooks, no collective), the steps a phase folds in still happen (FSDP2's shards around the trainable
build, a threaded run's stages as the loss), and rank 0 holds the whole run once however the contexts nest."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from kohakumoss.config.train import TrainConfig
from kohakumoss.distributed import World, rank_run
from kohakumoss.distributed.rank_run import RankRun
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.train.step import draw_step_noise
from kohakumoss.train.trainer import step_loss_fn, timestep_config

from . import helpers


def no_collectives(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a collective in one process")

    for name in ("all_reduce", "all_gather", "broadcast_object_list", "barrier"):
        monkeypatch.setattr(rank_run.dist, name, refuse)


def test_one_process_gets_every_piece_back_untouched(monkeypatch):
    no_collectives(monkeypatch)
    rr = RankRun(TrainConfig())
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = SimpleNamespace(plan=object())
    with rr.sharding(model, torch.float32, MemoryPlan()):
        pass
    assert not any(type(p) is not torch.nn.Parameter for p in model.parameters())  # nothing sharded

    def loss(batch, sigma, noise):
        return sigma

    assert rr.prepare_data(data) is data
    assert rr.prepare_model(model, None, MemoryPlan()) is model
    assert rr.step_fn(loss, None, None) is loss  # no `hooks`: the runner runs nothing around a micro-step
    assert rr.prepare_optimizer(optimizer) is optimizer
    totals = rr.reduce_step(4, 0.25, 3, 96)
    assert (totals.loss, totals.samples, totals.tokens, totals.peaks_gib) == (0.25, 3, 96, None)
    assert len(rr.reduce_step(4, 0.25, 3, 96, torch.device("cpu")).peaks_gib) == 1  # a logged step
    tr = SimpleNamespace(module=model, network=None, optimizer=optimizer)
    with rr.saving(tr, model) as shards:
        assert shards is None  # rank 0 writes trainable.safetensors and optimizer.pt itself
    assert (rr.is_main, rr.fsdp, rr.pipelined, rr.collective_saves) == (True, False, False, False)
    assert rr.main_decides(False) is False and rr.any_rank(True) is True


@pytest.mark.parametrize("algo, first", [("full", "shard"), ("lora", "build")])
def test_fsdp_shards_the_backbone_around_the_trainable_build(monkeypatch, algo, first):
    """A full fine-tune's optimizer steps the shards: sharded before it is built; an adapter wraps the
    sharded linears: sharded after (here the backbone comes whole, so `fully_shard` runs)."""
    monkeypatch.setattr(rank_run, "current", lambda: World(0, 2, 0, 2, torch.device("cpu"), "gloo"))
    calls = []
    monkeypatch.setattr(
        rank_run, "wrap_fsdp", lambda model, param_dtype: calls.append(("shard", param_dtype))
    )
    rr = RankRun(TrainConfig.from_knobs({"DISTRIBUTED": "fsdp", "DEVICES": 2, "ALGO": algo}))
    backbone = torch.nn.Module()
    backbone.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    with rr.sharding(backbone, torch.bfloat16, MemoryPlan()):
        calls.append("build")
    shard = ("shard", torch.bfloat16)
    assert calls == ([shard, "build"] if first == "shard" else ["build", shard])
    assert rr.fsdp and rr.collective_saves  # a checkpoint needs every rank's shards


def test_a_threaded_run_trains_through_its_stages():
    """DISTRIBUTED='threaded': the loss the trainer builds runs on the last stage, the micro-step's forward
    and backward run inside the step function, and the runner skips its own backward."""
    knobs = {"DISTRIBUTED": "threaded", "DEVICES": ["cpu", "cpu"], "DEVICE": "cpu", "PRECISION": "fp32"}
    cfg = TrainConfig.from_knobs(knobs)
    rr = RankRun(cfg)
    backbone = helpers.model()
    forward = rr.prepare_model(backbone, None, MemoryPlan())
    assert forward is not backbone and rr.pipelined  # the stages' prediction
    loss = step_loss_fn(cfg.objective, forward, torch.float32)
    step = rr.step_fn(loss, timestep_config(cfg.objective), draw_step_noise)
    assert step.runs_backward and rr.engine is not None
    batch = helpers.local_batch([0, 1])
    sigma, noise = draw_step_noise(0, 0, batch.x0, batch.seq, helpers.TCFG)
    value = step(batch, sigma, noise)
    assert torch.isfinite(value)
    assert all(p.grad is not None for p in backbone.layers.parameters())  # every stage ran its backward


def test_rank_zero_holds_the_whole_run_once_however_the_contexts_nest():
    """A save holds the whole run (here: DDP's node-shared optimizer states) and the checkpoint's exports
    inside it ask again: gathered once, not twice (under a pipeline a second gather would be a second
    round of collectives); the final exports after it gather again."""
    rr = RankRun(TrainConfig())
    held = []

    class NodeShare:
        @contextlib.contextmanager
        def main_holds_states(self, optimizer):
            held.append(optimizer)
            yield

    rr.node_share = NodeShare()
    model = torch.nn.Linear(2, 2)
    tr = SimpleNamespace(module=model, network=None, optimizer="optimizer")
    with rr.saving(tr, model) as shards:
        assert shards is None
        with rr.whole_weights(tr, model):  # the checkpoint's exports
            pass
    with rr.whole_weights(tr, model):  # the run's final exports
        pass
    assert held == ["optimizer", "optimizer"]
    assert rr.collective_saves
