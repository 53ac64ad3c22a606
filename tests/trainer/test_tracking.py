"""TensorBoard event files of a tiny run (scalars and the sample grid), LOGGERS checks, wandb refused when missing."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path

import pytest
from PIL import Image
from tensorboardX.proto.event_pb2 import Event

from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.train.loop import train
from kohakumoss.train.tracking import Trackers
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


def read_events(folder: Path) -> list[Event]:
    """Every event of the TFRecord files in `folder` (length, crc, data, crc per record)."""
    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at : at + 8])
            out.append(Event.FromString(data[at + 12 : at + 12 + n]))
            at += 12 + n + 4
    return out


def scalars(events: list[Event]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for e in events:
        for v in e.summary.value:
            if v.HasField("simple_value"):
                out.setdefault(v.tag, {})[e.step] = v.simple_value
    return out


def test_run_writes_tensorboard_scalars_and_grids(train_world):
    knobs = tiny_knobs(
        train_world, "tracked", STEPS=3, SAMPLE_PROMPTS=["blue glass hexagons"], SAMPLE_EVERY=2
    )
    run = train(knobs)
    events = read_events(run / "tensorboard")
    got = scalars(events)
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "peak_mem_gib"):
        want = {r["step"]: r[key] for r in lines}
        assert got[f"train/{key}"].keys() == want.keys() == {1, 2, 3}, key
        assert all(got[f"train/{key}"][s] == pytest.approx(v, rel=1e-6) for s, v in want.items()), key
    images = {e.step: v.image for e in events for v in e.summary.value if v.tag == "samples/grid"}
    assert sorted(images) == [2, 3]
    grid = Image.open(run / "samples" / "grid_step_00000003.png")
    assert (images[3].width, images[3].height) == grid.size


def test_no_loggers_writes_no_events(train_world):
    run = train(tiny_knobs(train_world, "untracked", STEPS=1, LOGGERS=[]))
    assert (run / "metrics.jsonl").exists() and not (run / "tensorboard").exists()


def test_loggers_knob_is_checked():
    for bad, words in ((["tensorbord"], "unknown logger"), (["tensorboard", "tensorboard"], "twice")):
        with pytest.raises(Exception, match=words):
            TRAIN_SCHEMA.validate({**TRAIN_SCHEMA.defaults(), "LOGGERS": bad})


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(
        ConfigError, match=r"LOGGERS: 'wandb' needs the wandb package, not installed here: pip install wandb"
    ):
        Trackers(["wandb"], tmp_path)


def test_resume_purges_the_steps_written_again(tmp_path):
    first = Trackers(["tensorboard"], tmp_path)
    for step in (1, 2, 3):
        first.scalars({"step": step, "loss": float(step)})
    first.close()
    again = Trackers(["tensorboard"], tmp_path, resume_step=1)
    again.scalars({"step": 2, "loss": 20.0, "note": "text", "bad": float("nan")})
    again.close()
    events = read_events(tmp_path / "tensorboard")
    purges = [e.step for e in events if e.HasField("session_log") and e.session_log.status == 1]  # START
    assert purges == [2]  # TensorBoard drops earlier events at step >= 2 from the first file
    assert scalars(events)["train/loss"][2] == 20.0 and "train/bad" not in scalars(events)


def test_a_resume_in_the_same_second_keeps_the_earlier_events(tmp_path, monkeypatch):
    """tensorboardX names the event file by the second it opens: a resume within it once overwrote the
    first file, and TensorBoard lost every step before the resume."""
    import time

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)  # both writers open in one second
    first = Trackers(["tensorboard"], tmp_path)
    for step in (1, 2, 3):
        first.scalars({"step": step, "loss": float(step)})
    first.close()
    again = Trackers(["tensorboard"], tmp_path, resume_step=2)
    again.scalars({"step": 3, "loss": 30.0})
    again.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert scalars(read_events(tmp_path / "tensorboard"))["train/loss"] == {1: 1.0, 2: 2.0, 3: 30.0}


def test_wandb_gets_the_same_scalars_and_grids(tmp_path, monkeypatch):
    logged, calls = [], {}

    class Run:
        def log(self, values, step):
            logged.append((step, values))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    fake = types.SimpleNamespace(init=init, Image=lambda im: ("image", im.size))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    trackers = Trackers(["wandb"], tmp_path / "run", {"LR": 1e-4, "lowercase": 1})
    trackers.scalars({"step": 3, "loss": 0.5, "val_loss": 0.25, "flag": True})
    trackers.image("samples/grid", Image.new("RGB", (8, 4)), 3)
    trackers.close()
    assert calls["init"]["name"] == "run" and calls["init"]["config"] == {"LR": 1e-4}
    assert logged == [(3, {"train/loss": 0.5, "val/loss": 0.25}), (3, {"samples/grid": ("image", (8, 4))})]
    assert calls["finished"] and not (tmp_path / "run" / "tensorboard").exists()


def test_a_logger_whose_package_is_missing_is_refused_when_the_knobs_are_checked(monkeypatch):
    """Said by the knob check, before the model is built (a GPU run once built 5B weights first)."""
    from kohakumoss.train import tracking

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if not installed
    assert "pip install tensorboardX" in tracking.loggers_problem(["tensorboard"])
    assert tracking.loggers_problem([]) is None
