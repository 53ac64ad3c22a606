"""EPOCHS / SAVE_EVERY_EPOCHS resolve to steps from the plan's epoch length; a finished run under a flat
LR schedule goes on by raising STEPS (no RESUME_ALLOW_CHANGES) and trains what one longer run trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kohakumoss.checkpoint.folders import list_checkpoints
from kohakumoss.config.train import TrainConfig
from kohakumoss.train.epochs import resolve_epochs, steps_per_epoch
from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_epoch_knobs_become_steps_once():
    assert steps_per_epoch(9, 2) == 5 and steps_per_epoch(8, 1) == 8
    cfg = TrainConfig.from_knobs({"EPOCHS": 3, "SAVE_EVERY_EPOCHS": 2, "SAMPLE_EVERY_EPOCHS": 1, "STEPS": 7})
    out = resolve_epochs(cfg, 5)
    assert (out.optim.steps, out.run.save_every, out.samples.sample_every) == (15, 10, 5)
    plain = TrainConfig.from_knobs({"STEPS": 7, "SAVE_EVERY": 3})
    assert resolve_epochs(plain, 5) == plain  # unset *_EPOCHS knobs leave the steps knobs alone


def test_epochs_train_whole_epochs_and_save_at_their_ends(train_world):
    # 4 pictures x 2 repeats, 2 a step: 4 steps an epoch
    run = train(tiny_knobs(train_world, "epochs", EPOCHS=2, SAVE_EVERY_EPOCHS=1, KEEP_LAST=5, STEPS=1))
    assert len(losses(run)) == 8
    assert [step for step, _ in list_checkpoints(run / "checkpoints")] == [4, 8]
    assert "EPOCHS 2: 4 steps per epoch, 8 steps" in (run / "log.txt").read_text()


def test_a_finished_run_goes_on_when_steps_is_raised(train_world):
    straight = losses(train(tiny_knobs(train_world, "long", STEPS=5)))
    train(tiny_knobs(train_world, "extended", STEPS=3))
    run = train(tiny_knobs(train_world, "extended", STEPS=5, RESUME="latest"))
    assert losses(run) == pytest.approx(straight, rel=1e-6)
    # a decaying schedule spreads over STEPS: raising them changes the LR after the checkpoint, so asked for
    train(tiny_knobs(train_world, "cosine", STEPS=3, LR_SCHEDULE="cosine"))
    with pytest.raises(ConfigError, match=r"STEPS 3 -> 5.*RESUME_ALLOW_CHANGES.*spreads its decay"):
        train(tiny_knobs(train_world, "cosine", STEPS=5, LR_SCHEDULE="cosine", RESUME="latest"))
