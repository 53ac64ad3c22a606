"""The ss_* / modelspec.* keys built from a run's knobs and folder."""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
from PIL import Image

from kohakumoss.export.metadata import carried, describe, last_sample, read_metadata, run_metadata
from kohakumoss.export.run_facts import dataset_facts, write_run_facts
from kohakumoss_common.errors import CheckpointError

KNOBS = {"RUNS_DIR": "", "RUN_NAME": "my-lora", "ALGO": "lokr", "RANK": 8, "ALPHA": 4.0, "LR": 2e-4,
         "STEPS": 100, "SEED": 7, "AREA": 512 * 512, "DATASET": {"kind": "kohya", "path": "data/train"},
         "ALGO_ARGS": {"factor": 4}, "TARGET_PRESET": "attn-mlp", "LR_SCHEDULE": "cosine", "GRAD_CLIP": 1.0,
         "WEIGHTS": "/models/moss-image.safetensors"}  # fmt: skip


def test_run_metadata_keys(tmp_path):
    run = tmp_path / "my-lora"
    for step, color in ((10, "red"), (20, "blue"), (30, "green")):
        (run / "samples" / f"step_{step:08d}").mkdir(parents=True)
        for i, shade in enumerate((color, "white")):
            Image.new("RGB", (600, 300), shade).save(
                run / "samples" / f"step_{step:08d}" / f"sample_{i:02d}.png"
            )
    Image.new("RGB", (900, 300), "black").save(run / "samples" / "grid_step_00000020.png")
    facts = {"datasets": [], "dataset_dirs": {}, "reg_dataset_dirs": {}, "tag_frequency": {}, "bucket_info": {},
             "num_train_images": 0, "num_reg_images": 0, "epoch_steps": [10, 10, 10]}  # fmt: skip
    write_run_facts(run, facts, started_at=1234.5)
    meta = run_metadata({**KNOBS, "RUNS_DIR": str(tmp_path), "TRIGGER_PHRASE": "mystyle", "GRAD_ACCUM": 2}, 8)
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["ss_network_dim"] == "8" and meta["ss_network_alpha"] == "4.0" and meta["ss_steps"] == "8"
    assert json.loads(meta["ss_network_args"])["factor"] == 4 and meta["ss_seed"] == "7"
    assert meta["ss_learning_rate"] == "0.0002" and meta["ss_resolution"] == "(512, 512)"
    assert meta["ss_sd_model_name"] == "moss-image.safetensors"
    assert meta["modelspec.architecture"] == "MOSS-Image/lokr" and meta["modelspec.title"] == "my-lora"
    assert meta["modelspec.resolution"] == "512x512" and meta["modelspec.trigger_phrase"] == "mystyle"
    assert (
        meta["ss_training_started_at"] == "1234.5"
        and abs(float(meta["ss_training_finished_at"]) - time.time()) < 60
    )
    assert meta["ss_num_epochs"] == "3" and meta["ss_epoch"] == "2"  # micro-step 16 is in the second epoch
    meta = run_metadata({**KNOBS, "RUNS_DIR": str(tmp_path)}, 25)
    head, data = meta["modelspec.thumbnail"].split(",", 1)
    assert head == "data:image/jpeg;base64"
    thumb = Image.open(io.BytesIO(base64.b64decode(data)))
    assert thumb.format == "JPEG" and thumb.size == (256, 128)  # one sample, not the grid
    assert thumb.getpixel((128, 60))[2] > 200  # step 20's first sample (blue): the last at or before step 25
    assert last_sample(run) == run / "samples" / "step_00000030" / "sample_00.png"


def test_no_folder_no_trigger(tmp_path):
    meta = run_metadata({**KNOBS, "RUNS_DIR": str(tmp_path)}, 3)
    assert not {"modelspec.thumbnail", "modelspec.trigger_phrase", "ss_training_started_at"} & meta.keys()
    assert json.loads(meta["ss_datasets"]) == [{"subsets": [{"image_dir": "train"}]}]  # a basename, no path


def test_dataset_facts_in_kohya_shapes(tmp_path):
    """Two datasets: kohya subsets by folder, a plain folder by its basename, reg images apart, repeats
    multiplied, tags counted per folder, per-dataset caption settings in the subsets and no top-level
    value where they differ; nothing names the paths."""
    from kohakumoss_data import Catalog, build_plan
    from kohakumoss_data.catalog import ScanReport
    from kohakumoss_data.dataset_options import dataset_options
    from kohakumoss_data.plan import PlanKnobs
    from kohakumoss_data.records import CatalogItem

    spec = [{"kind": "kohya", "path": "/home/me/data/char", "shuffle_caption": True},
            {"kind": "folder", "path": "/home/me/reg/", "reg": True, "repeats": 3}]  # fmt: skip
    items = [CatalogItem(f"0/{d}/{n}.png", "u", "l", 64, 64, n, [cap], repeats=r)
             for d, r, n, cap in (("2_cat", 2, "a", "cat, red"), ("2_cat", 2, "b", "cat"), ("5_dog", 5, "c", "dog"))]  # fmt: skip
    items.append(CatalogItem("1/x.png", "u", "l", 64, 32, "x", ["person"]))
    catalog = Catalog({"kind": "concat"}, items, ScanReport())
    knobs = PlanKnobs(
        area=64 * 64, tokens_per_step=10_000, datasets=dataset_options(spec), patch_px=16, multiple=16
    )
    facts = dataset_facts(spec, catalog, build_plan(catalog, 0, knobs), 64)
    assert facts["dataset_dirs"] == {
        "2_cat": {"n_repeats": 2, "img_count": 2},
        "5_dog": {"n_repeats": 5, "img_count": 1},
    }
    assert facts["reg_dataset_dirs"] == {"reg": {"n_repeats": 3, "img_count": 1}}
    assert facts["tag_frequency"] == {"2_cat": {"cat": 2, "red": 1}, "5_dog": {"dog": 1}}
    assert facts["num_train_images"] == 9 and facts["num_reg_images"] == 3
    buckets = facts["bucket_info"]["buckets"].values()
    assert sum(b["count"] for b in buckets) == 18 and len(buckets) == 2  # reg: as many places as the rest
    write_run_facts(tmp_path, facts)
    meta = run_metadata(
        {**KNOBS, "RUNS_DIR": str(tmp_path.parent), "RUN_NAME": tmp_path.name, "DATASET": spec}, 1
    )
    assert "/home/me" not in json.dumps(meta) and meta["ss_shuffle_caption"] == "True"
    subsets = [s for d in json.loads(meta["ss_datasets"]) for s in d["subsets"]]
    assert [s["shuffle_caption"] for s in subsets] == [True, True, False] and subsets[2]["is_reg"]
    spec[1]["reg"] = False
    knobs = PlanKnobs(
        area=64 * 64, tokens_per_step=10_000, datasets=dataset_options(spec), patch_px=16, multiple=16
    )
    write_run_facts(tmp_path, dataset_facts(spec, catalog, build_plan(catalog, 0, knobs), 64))
    meta = run_metadata(
        {**KNOBS, "RUNS_DIR": str(tmp_path.parent), "RUN_NAME": tmp_path.name, "DATASET": spec}, 1
    )
    assert "ss_shuffle_caption" not in meta and meta["ss_keep_tokens"] == "0"  # the datasets differ / agree


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


def test_a_checkpoint_reexport_carries_its_lycoris_file_keys(tmp_path):
    """SAVE_FORMAT='hf': the checkpoint's only adapter file is in export/lycoris/; a re-export carries its keys."""
    import torch
    from safetensors.torch import save_file

    from kohakumoss.export.from_checkpoint import source_metadata

    ckpt = tmp_path / "my-lora" / "checkpoints" / "step_00000004"
    (ckpt / "export" / "lycoris").mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({**KNOBS, "RUNS_DIR": str(tmp_path)}))
    (ckpt / "meta.json").write_text(json.dumps({"step": 4}))
    meta = {"modelspec.date": "2026-01-02T03:04:05Z", "sshs_model_hash": "ab"}
    save_file({"x": torch.zeros(1)}, str(ckpt / "export" / "lycoris" / "my-lora.safetensors"), meta)
    got = source_metadata(ckpt)
    assert got["modelspec.date"] == "2026-01-02T03:04:05Z" and got["ss_steps"] == "4"
    assert "sshs_model_hash" not in got  # each file hashes its own tensors
