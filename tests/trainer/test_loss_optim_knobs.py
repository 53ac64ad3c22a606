"""The trainer's loss and optimizer knobs end to end on the tiny model: each reaches the step (the losses
move), a schedule-free run with the loss options resumes bit for bit, and a placement that cannot step
the chosen optimizer is refused by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_loss_knobs_reach_the_step(train_world):
    base = losses(train(tiny_knobs(train_world, "l2", STEPS=2)))
    for name, knobs in {
        "huber": dict(LOSS_TYPE="pseudo_huber", HUBER_C=0.05),
        "minsnr": dict(LOSS_WEIGHTING="min_snr", MIN_SNR_GAMMA=1.0),
        "mode": dict(TIMESTEP_SAMPLING="mode", MODE_SCALE=1.5),
    }.items():
        got = losses(train(tiny_knobs(train_world, name, STEPS=2, **knobs)))
        assert got[0] != base[0], name  # the first step's loss already differs: the knob acted


@pytest.mark.skipif(importlib.util.find_spec("schedulefree") is None, reason="schedulefree is not installed")
def test_schedulefree_run_with_loss_options_resumes_exactly(train_world):
    knobs = dict(
        STEPS=6,
        OPTIMIZER="schedulefree_adamw",
        OPTIMIZER_ARGS={"warmup_steps": 2},
        LR=2e-3,
        LOSS_TYPE="huber",
        LOSS_WEIGHTING="min_snr",
        TIMESTEP_SAMPLING="mode",
    )
    straight = train(tiny_knobs(train_world, "sf-straight", **knobs, SAVE_EVERY=3))
    train(tiny_knobs(train_world, "sf-halves", **knobs, STOP_AT=3))
    resumed = train(tiny_knobs(train_world, "sf-halves", **knobs, RESUME="latest"))
    assert len(losses(straight)) == 6
    assert losses(straight) == losses(resumed)
    with pytest.raises(ConfigError, match="LOSS_TYPE"):  # resume compares the loss knobs
        train(tiny_knobs(train_world, "sf-halves", **{**knobs, "LOSS_TYPE": "l1"}, RESUME="latest"))


@pytest.mark.skipif(importlib.util.find_spec("prodigyopt") is None, reason="prodigyopt is not installed")
def test_an_optimizer_the_placement_cannot_step_is_refused(train_world):
    with pytest.raises(ConfigError, match="OPTIMIZER_PLACEMENT.*Prodigy"):
        train(
            tiny_knobs(
                train_world, "prodigy-stream", OPTIMIZER="prodigy", LR=1.0, OPTIMIZER_PLACEMENT="stream"
            )
        )


def test_optimizer_knob_names_a_missing_package(train_world):
    with pytest.raises(ConfigError, match="OPTIMIZER.*no_such_pkg"):
        train(tiny_knobs(train_world, "nopkg", OPTIMIZER="no_such_pkg.Opt"))
