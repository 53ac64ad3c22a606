"""A tiny run's adapter files carry ss_* / modelspec.* metadata; the export script shows and keeps it."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import stat
from pathlib import Path

from PIL import Image

from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.export.metadata import FORMAT_KEYS, HASH_KEYS, read_metadata
from kohakumoss.train.loop import train
from kohakumoss_common.hashing import safetensors_data_sha256
from kohakumoss_common.io import read_header
from kohakumoss_common.knobs import run_checked

from .conftest import PICKS, tiny_knobs
from .test_scripts import load_script


def test_exports_carry_run_metadata_and_reexports_keep_it(train_world, tmp_path, capsys):
    knobs = tiny_knobs(train_world, "meta", STEPS=2, SAVE_EVERY=1, SAVE_FORMAT="both", TRIGGER_PHRASE="mystyle",
                       SAMPLE_PROMPTS=["blue glass hexagons"], SAMPLE_EVERY=1, ALGO="loha", SAVE_MERGED=True,
                       SAVE_DIFFUSERS=True)  # fmt: skip
    before = os.umask(0o022)
    try:
        run = train(knobs)
    finally:
        os.umask(before)
    assert_shareable(run, train_world["root"])
    final = {
        "lycoris": read_metadata(run / "export" / "lycoris" / "meta.safetensors"),
        "comfy": read_metadata(run / "export" / "meta-comfy.safetensors"),
    }
    ckpt = run / "checkpoints" / "step_00000001"
    at_one = read_metadata(ckpt / "export" / "lycoris" / "meta.safetensors")
    for meta in (*final.values(), at_one):
        assert meta["ss_network_module"] == "lycoris.kohya" and meta["ss_network_dim"] == "4"
        assert meta["modelspec.architecture"] == "MOSS-Image/loha" and meta["modelspec.title"] == "meta"
        assert meta["modelspec.sai_model_spec"] == "1.0.0" and meta["modelspec.trigger_phrase"] == "mystyle"
        assert meta["ss_base_model_version"] == "moss_image" and "ss_training_started_at" in meta
        assert meta["modelspec.thumbnail"].startswith("data:image/jpeg;base64,")
    assert final["lycoris"]["ss_steps"] == final["comfy"]["ss_steps"] == "2" and at_one["ss_steps"] == "1"
    assert final["comfy"]["kohakumoss_format"] == "comfy" and "kohakumoss_format" not in final["lycoris"]
    assert final["lycoris"]["modelspec.thumbnail"] != at_one["modelspec.thumbnail"]  # the step-2 grid

    ns = load_script("scripts/export/export.py")
    base = {**ns, "MODEL_PRESET": "tiny"}
    again = {**base, "ADAPTER": str(ckpt), "OUT": str(tmp_path / "ckpt"), "NAME": "again"}
    assert run_checked(EXPORT_SCHEMA, again, ns["run"], "export.py") == 0
    for kind in ("lycoris/again", "again-comfy"):
        meta = read_metadata(tmp_path / "ckpt" / f"{kind}.safetensors")
        kept = {k: v for k, v in at_one.items() if k not in FORMAT_KEYS}
        assert {k: meta[k] for k in kept} == kept, kind  # same date, thumbnail and step as the run wrote
    lycoris = run / "export" / "lycoris" / "meta.safetensors"
    from_file = {**base, "ADAPTER": str(lycoris), "OUT": str(tmp_path / "file"), "NAME": "f"}
    assert run_checked(EXPORT_SCHEMA, from_file, ns["run"], "export.py") == 0
    meta = read_metadata(tmp_path / "file" / "f-comfy.safetensors")
    assert all(meta[k] == v for k, v in final["lycoris"].items() if k not in HASH_KEYS), (
        "re-export keeps keys"
    )
    assert meta["sshs_model_hash"] == safetensors_data_sha256(tmp_path / "file" / "f-comfy.safetensors")

    capsys.readouterr()
    show = {**base, "ADAPTER": str(lycoris), "SHOW_METADATA": True, "OUT": str(tmp_path / "none")}
    assert run_checked(EXPORT_SCHEMA, show, ns["run"], "export.py") == 0
    out = capsys.readouterr().out
    assert "ss_steps: 2" in out and "modelspec.trigger_phrase: mystyle" in out and "chars)" in out
    assert not Path(tmp_path / "none").exists()
    show_ckpt = {**show, "ADAPTER": str(ckpt)}
    assert run_checked(EXPORT_SCHEMA, show_ckpt, ns["run"], "export.py") == 0
    assert "ss_steps: 1" in capsys.readouterr().out


_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:[\\/]|\\\\)")


def local_paths(value: object) -> list[str]:
    """Every string (keys too) inside a metadata value, parsed as JSON where it is, that is an absolute path."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return [value] if _ABSOLUTE.match(value) else []
        return (
            local_paths(parsed)
            if not isinstance(parsed, str)
            else ([parsed] if _ABSOLUTE.match(parsed) else [])
        )
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in local_paths(str(k)) + local_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in local_paths(v)]
    return []


def assert_shareable(run: Path, root: str) -> None:
    """Every export of the run (the final ones and each checkpoint's): no header names a local path, files
    and folders have the umask's modes (0644 / 0755 under 022), the kohya keys describe the data."""
    exports = [run / "export", *sorted((run / "checkpoints").glob("step_*/export"))]
    files = [f for folder in exports for f in sorted(folder.rglob("*")) if f.is_file()]
    assert any(f.parent.name == "lycoris" for f in files) and any(f.parent.name == "merged" for f in files)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
        assert stat.S_IMODE(f.parent.stat().st_mode) == 0o755, f.parent
        text = f.read_text() if f.suffix == ".json" else None
        meta = read_header(f)[1] if f.suffix == ".safetensors" else {"json": text}
        for key, value in meta.items():
            assert root not in value and not local_paths(value), (f, key, local_paths(value))
    meta = read_metadata(run / "export" / "meta-comfy.safetensors")
    assert json.loads(meta["ss_dataset_dirs"]) == {"2_style": {"n_repeats": 2, "img_count": 4}}
    assert json.loads(meta["ss_tag_frequency"]) == {"2_style": {c: 1 for c in sorted(PICKS.values())}}
    assert meta["ss_num_train_images"] == "8" and int(meta["ss_num_epochs"]) >= 1
    buckets = json.loads(meta["ss_bucket_info"])["buckets"]
    assert sum(b["count"] for b in buckets.values()) == 8 and buckets["0"]["resolution"] == [64, 64]
    (dataset,) = json.loads(meta["ss_datasets"])
    assert dataset["subsets"][0]["image_dir"] == "2_style" and dataset["num_train_images"] == 8
    assert meta["ss_shuffle_caption"] == "False" and meta["ss_caption_dropout_rate"] == "0.0"
    assert float(meta["ss_training_started_at"]) <= float(meta["ss_training_finished_at"])
    for path in (run / "export" / "meta-comfy.safetensors", run / "export" / "lycoris" / "meta.safetensors"):
        own = read_metadata(path)
        assert own["sshs_model_hash"] == safetensors_data_sha256(path), path
        assert (
            own["modelspec.hash_sha256"] == "0x" + own["sshs_model_hash"]
            and len(own["sshs_legacy_hash"]) == 8
        )
    head, data = meta["modelspec.thumbnail"].split(",", 1)
    assert Image.open(io.BytesIO(base64.b64decode(data))).size == (32, 32), "one sample, not the grid"
