"""The ss_* / modelspec.* keys built from a run's knobs and folder."""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
from PIL import Image

from kohakumoss.export.metadata import carried, describe, last_grid, read_metadata, run_metadata
from kohakumoss_common.errors import CheckpointError

KNOBS = {"RUNS_DIR": "", "RUN_NAME": "my-lora", "ALGO": "lokr", "RANK": 8, "ALPHA": 4.0, "LR": 2e-4,
         "STEPS": 100, "SEED": 7, "AREA": 512 * 512, "DATASET": {"kind": "kohya", "path": "data/train"},
         "ALGO_ARGS": {"factor": 4}, "TARGET_PRESET": "attn-mlp", "LR_SCHEDULE": "cosine", "GRAD_CLIP": 1.0,
         "WEIGHTS": "/models/moss-image.safetensors"}  # fmt: skip


def test_run_metadata_keys(tmp_path):
    run = tmp_path / "my-lora"
    (run / "samples").mkdir(parents=True)
    (run / "log.txt").write_text("2026-01-02 03:04:05 I kohakumoss.train: start\n")
    for step, color in ((10, "red"), (20, "blue"), (30, "green")):
        Image.new("RGB", (622, 300), color).save(run / "samples" / f"grid_step_{step:08d}.png")
    meta = run_metadata({**KNOBS, "RUNS_DIR": str(tmp_path), "TRIGGER_PHRASE": "mystyle"}, 25)
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["ss_network_dim"] == "8" and meta["ss_network_alpha"] == "4.0" and meta["ss_steps"] == "25"
    assert json.loads(meta["ss_network_args"])["factor"] == 4 and meta["ss_seed"] == "7"
    assert meta["ss_learning_rate"] == "0.0002" and meta["ss_resolution"] == "(512, 512)"
    assert json.loads(meta["ss_datasets"]) == [{"kind": "kohya", "path": "data/train"}]
    assert meta["ss_sd_model_name"] == "moss-image.safetensors"
    assert meta["modelspec.architecture"] == "MOSS-Image/lokr" and meta["modelspec.title"] == "my-lora"
    assert meta["modelspec.resolution"] == "512x512" and meta["modelspec.trigger_phrase"] == "mystyle"
    started = float(meta["ss_training_started_at"])
    assert abs(started - time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))) < 1
    head, data = meta["modelspec.thumbnail"].split(",", 1)
    assert head == "data:image/jpeg;base64"
    thumb = Image.open(io.BytesIO(base64.b64decode(data)))
    assert thumb.format == "JPEG" and max(thumb.size) == 256
    assert thumb.getpixel((128, 60))[2] > 200  # the step-20 grid (blue): the last one at or before step 25
    assert last_grid(run) == run / "samples" / "grid_step_00000030.png"


def test_no_folder_no_trigger(tmp_path):
    meta = run_metadata({**KNOBS, "RUNS_DIR": str(tmp_path)}, 3)
    assert not {"modelspec.thumbnail", "modelspec.trigger_phrase", "ss_training_started_at"} & meta.keys()


def test_read_describe_and_carry(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "a.safetensors"
    save_file(
        {"x": torch.zeros(1)}, str(path), {"ss_steps": "3", "kohakumoss_format": "comfy", "t": "y" * 500}
    )
    meta = read_metadata(path)
    assert carried(meta) == {"ss_steps": "3", "t": "y" * 500}
    text = describe(meta)
    assert "ss_steps: 3" in text and "(500 chars)" in text
    with pytest.raises(CheckpointError, match="no such file"):
        read_metadata(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        read_metadata(tmp_path / "bad.safetensors")
