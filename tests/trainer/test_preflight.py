"""The trainer's refusals before anything loads are kohakumoss-config check's (train/preflight.py), and
the run records what changes its numbers without a knob (CPU threads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


class Built(Exception):
    """Raised in place of build_components: the run got past its checks."""


@pytest.mark.parametrize("knob", ["TEXT_ENCODER", "VAE"])
def test_an_empty_encoder_is_refused_before_anything_loads(train_world, monkeypatch, knob):
    """An empty TEXT_ENCODER / VAE once passed `check` and raised AttributeError in the trainer."""
    from kohakumoss.train import trainer

    monkeypatch.setattr(trainer, "build_components", lambda *a, **k: pytest.fail("components were built"))
    with pytest.raises(ConfigError, match=f"{knob}: training needs {knob}"):
        train(tiny_knobs(train_world, f"no-{knob.lower()}", **{knob: ""}))


def test_config_json_records_the_cpu_threads(train_world, monkeypatch):
    """A 1-thread and a 2-thread CPU run part after a few steps; the count is in the run's config.json."""
    from kohakumoss.train import trainer

    def stop(*a, **k):
        raise Built

    monkeypatch.setattr(trainer, "build_components", stop)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    threads = torch.get_num_threads()
    with pytest.raises(Built):
        train(tiny_knobs(train_world, "threads"))
    run = Path(tiny_knobs(train_world, "threads")["RUNS_DIR"]) / "threads"
    config = json.loads((run / "config.json").read_text())
    assert config["_runtime"]["torch_threads"] == threads and config["_runtime"]["OMP_NUM_THREADS"] == "3"
    assert config["STEPS"] == 6  # the knobs beside it, as before
