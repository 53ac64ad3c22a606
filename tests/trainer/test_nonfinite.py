"""A run whose weights or gradients go non-finite stops by name and writes nothing of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kohakumoss.train.finite import NonFiniteWeights, nonfinite_tensors
from kohakumoss.train.loop import train

from .conftest import tiny_knobs


def test_non_finite_weights_are_never_checkpointed_or_exported(train_world, monkeypatch):
    """What LR=inf did: the first step's loss was finite, its update made every weight non-finite, the
    later steps were skipped (fewer than MAX_BAD_STEPS) and the run saved and exported the NaN adapter.
    Now the last checkpoint's check stops the run with NonFiniteWeights, and nothing is written."""
    from kohakumoss.train import runner

    update = runner.StepRunner.update

    def poisoning(self, res):  # the update an infinite LR makes
        update(self, res)
        for opt in self.optimizer.optimizers.values():
            for group in opt.param_groups:
                for p in group["params"]:
                    p.data.fill_(float("inf"))

    monkeypatch.setattr(runner.StepRunner, "update", poisoning)
    with pytest.raises(
        NonFiniteWeights, match=r"step 3: the trainable weights are not finite .*no checkpoint"
    ):
        train(tiny_knobs(train_world, "inf-weights", STEPS=3, MAX_BAD_STEPS=5))
    run = Path(tiny_knobs(train_world, "inf-weights")["RUNS_DIR"]) / "inf-weights"
    assert not list((run / "checkpoints").glob("step_*")) and not (run / "export").exists()
    log = (run / "log.txt").read_text()
    assert "2 in a row" in log and "stopped: step 3: the trainable weights are not finite" in log


def test_a_finite_loss_with_non_finite_gradients_is_skipped(train_world, monkeypatch):
    """The device-side skip reads the gradient norm too: a finite loss whose gradients are NaN (the clip
    turns an infinite norm into NaN) updates nothing, and the run goes on with finite weights."""
    from kohakumoss.train import trainer

    real, calls = trainer.flow_loss, [0]

    def nan_gradients(*a, **kw):
        calls[0] += 1
        loss = real(*a, **kw)
        return loss + torch.sqrt(loss * 0) if calls[0] == 2 else loss  # value loss, gradient 0 * inf

    monkeypatch.setattr(trainer, "flow_loss", nan_gradients)
    run = train(tiny_knobs(train_world, "nan-grads", STEPS=4, MAX_BAD_STEPS=2))
    assert "step 1: non-finite loss or gradients, step skipped (1 in a row)" in (run / "log.txt").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 3, 4] and records[-1]["skipped"] == 1
    saved = load_file(str(run / "checkpoints" / "step_00000004" / "trainable.safetensors"))
    assert saved and all(bool(torch.isfinite(t).all()) for t in saved.values())


def test_nonfinite_tensors_names_parameters_and_buffers():
    module = torch.nn.Linear(3, 2)
    module.register_buffer("scale", torch.ones(2))
    assert nonfinite_tensors(module) == []
    with torch.no_grad():
        module.bias[1] = float("nan")
        module.scale[0] = float("-inf")
    assert nonfinite_tensors(module) == ["bias", "scale"]


def test_nonfinite_tensors_skips_what_this_process_does_not_hold():
    """A pipeline rank's other stages sit on the meta device: not read (reading one raises)."""
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with torch.no_grad():
        module[0].weight[0, 0] = float("inf")
    assert nonfinite_tensors(module) == ["0.weight"]
