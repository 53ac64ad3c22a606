"""RESUME='latest' over a newest checkpoint with one file cut or deleted: the run falls back to the older
checkpoint and takes every piece of state from it (weights, optimizer, RNG, data position, step, metrics
tail, TensorBoard step), so its losses and metrics equal the uninterrupted run's bit for bit through STEPS.

The world is the issue's: five tiny pictures and one broken file, a plan of 3 steps per epoch over 2 epochs,
checkpoints at steps 2 and 4 (STOP_AT=4), so the fallback's steps cross an epoch boundary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kohakumoss.checkpoint.folders import list_checkpoints, verify_checkpoint
from kohakumoss.encoders.tiny import write_tiny_text_encoder, write_tiny_vae
from kohakumoss.train.loop import train

from .conftest import tiny_knobs
from .test_tracking import read_events, scalars

SIZE = 64
CAPTIONS = ["red square", "green circle", "blue stripes", "gray dots", "pink waves"]
# the knobs a metrics line holds that do not depend on the wall clock
EXACT = ("step", "loss", "lr", "grad_norm", "samples", "tokens", "skipped")
# every file a checkpoint of this run holds (test_the_cases_cover_every_file checks the list)
FILES = [
    "meta.json",
    "trainable.safetensors",
    "optimizer.pt",
    "rng.json",
    "rng.safetensors",
    "data.json",
    "config.json",
    "export/stopped-comfy.safetensors",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fallback")
    data = root / "data" / "1_shapes"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, caption in enumerate(CAPTIONS):
        pixels = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(data / f"im{i}.png")
        (data / f"im{i}.txt").write_text(caption)
    (data / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"cut" * 10)  # dropped by the scan
    (data / "broken.txt").write_text("broken")
    text = write_tiny_text_encoder(root / "text", CAPTIONS)
    return {
        "DATASET": {"kind": "kohya", "path": str(root / "data")},
        "TEXT_ENCODER": text.path,
        "TOKENIZER": text.tokenizer_path,
        "TEXT_TEMPLATE": text.template,
        "VAE": str(write_tiny_vae(root / "vae")),
        "root": str(root),
    }


def knobs(world: dict, name: str, **overrides) -> dict:
    # 2 pictures a step: 5 usable items make 3 steps per epoch, STEPS=6 two epochs
    plan = dict(STEPS=6, SAVE_EVERY=2, KEEP_LAST=5, LOGGERS=["tensorboard"])
    return tiny_knobs(world, name, **plan, TOKENS_PER_STEP=2 * (SIZE * SIZE // 256 + 16), **overrides)


def records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in EXACT} for r in map(json.loads, lines)]


def last_scalars(run: Path) -> dict[str, dict[int, float]]:
    """What TensorBoard shows: per tag and step the value written last (a resume's purge hides the rest)."""
    return scalars(read_events(run / "tensorboard"))


@pytest.fixture(scope="module")
def runs(world) -> dict:
    """The uninterrupted run through STEPS, and a run stopped at step 4 (its folder copied per case)."""
    straight = train(knobs(world, "straight"))
    stopped = train(knobs(world, "stopped", STOP_AT=4))
    assert "3 steps per epoch, 2 epoch(s)" in (straight / "log.txt").read_text()
    assert [s for s, _ in list_checkpoints(stopped / "checkpoints")] == [2, 4]
    return {"straight": straight, "stopped": stopped}


def test_the_cases_cover_every_file(runs):
    newest = list_checkpoints(runs["stopped"] / "checkpoints")[-1][1]
    held = sorted(p.relative_to(newest).as_posix() for p in newest.rglob("*") if p.is_file())
    assert held == sorted(FILES)


@pytest.mark.parametrize("fault", ["cut", "deleted"])
@pytest.mark.parametrize("name", FILES)
def test_a_fallback_takes_every_piece_of_state_from_the_older_checkpoint(world, runs, name, fault):
    run = Path(world["root"]) / "runs" / f"fallback-{fault}-{name.replace('/', '-')}"
    shutil.copytree(runs["stopped"], run)
    newest = run / "checkpoints" / "step_00000004"
    victim = newest / name
    if fault == "cut":
        victim.write_bytes(victim.read_bytes()[:100])
    else:
        victim.unlink()
    resumed = train(knobs(world, run.name, RESUME="latest"))
    log = (resumed / "log.txt").read_text()
    assert "resumed from" in log and "step_00000002 at step 2" in log, log[-2000:]
    straight = runs["straight"]
    assert [r["loss"] for r in records(resumed)] == [r["loss"] for r in records(straight)]
    assert records(resumed) == records(straight)  # steps 3-6 trained again on the same batches, bit for bit
    shown, expected = last_scalars(resumed), last_scalars(straight)
    assert shown["train/loss"] == expected["train/loss"] and sorted(shown["train/loss"]) == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 4, 6]
    assert verify_checkpoint(newest) is None  # step 4 written again by the resumed run


def test_a_resume_counts_the_skipped_steps_of_the_checkpoint_it_took(world, monkeypatch):
    """Step 1's loss is non-finite (skipped); the metrics' `skipped` count after the fallback to step 2
    goes on from the checkpoint's, as the uninterrupted run's does."""
    from kohakumoss.train import trainer

    real = trainer.flow_loss

    def nan_first():  # a fresh counter per run: its first micro-step's loss is NaN
        calls = [0]

        def flaky(*a, **kw):
            calls[0] += 1
            return real(*a, **kw) * (float("nan") if calls[0] == 1 else 1.0)

        return flaky

    monkeypatch.setattr(trainer, "flow_loss", nan_first())
    straight = train(knobs(world, "skips-straight", MAX_BAD_STEPS=2))
    monkeypatch.setattr(trainer, "flow_loss", nan_first())
    run = train(knobs(world, "skips", MAX_BAD_STEPS=2, STOP_AT=4))
    monkeypatch.undo()  # the resumed steps are all finite, as the uninterrupted run's steps 3-6
    assert [r["skipped"] for r in records(straight)] == [1, 1, 1, 1, 1]  # step 1 has no line
    rng = run / "checkpoints" / "step_00000004" / "rng.safetensors"
    rng.write_bytes(rng.read_bytes()[:100])
    resumed = train(knobs(world, "skips", MAX_BAD_STEPS=2, RESUME="latest"))
    assert records(resumed) == records(straight)
