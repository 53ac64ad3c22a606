"""A tiny run's adapter files carry ss_* / modelspec.* metadata; the export script shows and keeps it."""

from __future__ import annotations

from pathlib import Path

from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.config.knobs import run_checked
from kohakumoss.export.metadata import read_metadata
from kohakumoss.train.loop import train

from .conftest import tiny_knobs
from .test_scripts import load_script


def test_exports_carry_run_metadata_and_reexports_keep_it(train_world, tmp_path, capsys):
    knobs = tiny_knobs(train_world, "meta", STEPS=2, SAVE_EVERY=1, SAVE_FORMAT="both", TRIGGER_PHRASE="mystyle",
                       SAMPLE_PROMPTS=["blue glass hexagons"], SAMPLE_EVERY=1, ALGO="loha")  # fmt: skip
    run = train(knobs)
    final = {
        kind: read_metadata(run / "export" / f"meta-{kind}.safetensors") for kind in ("lycoris", "comfy")
    }
    ckpt = run / "checkpoints" / "step_00000001"
    at_one = read_metadata(ckpt / "export" / "meta-lycoris.safetensors")
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
    for kind in ("lycoris", "comfy"):
        meta = read_metadata(tmp_path / "ckpt" / f"again-{kind}.safetensors")
        kept = {k: v for k, v in at_one.items() if k != "kohakumoss_format"}
        assert {k: meta[k] for k in kept} == kept, kind  # same date, thumbnail and step as the run wrote
    lycoris = run / "export" / "meta-lycoris.safetensors"
    from_file = {**base, "ADAPTER": str(lycoris), "OUT": str(tmp_path / "file"), "NAME": "f"}
    assert run_checked(EXPORT_SCHEMA, from_file, ns["run"], "export.py") == 0
    meta = read_metadata(tmp_path / "file" / "f-comfy.safetensors")
    assert all(meta[k] == v for k, v in final["lycoris"].items()), "a re-export of a file keeps its keys"

    capsys.readouterr()
    show = {**base, "ADAPTER": str(lycoris), "SHOW_METADATA": True, "OUT": str(tmp_path / "none")}
    assert run_checked(EXPORT_SCHEMA, show, ns["run"], "export.py") == 0
    out = capsys.readouterr().out
    assert "ss_steps: 2" in out and "modelspec.trigger_phrase: mystyle" in out and "chars)" in out
    assert not Path(tmp_path / "none").exists()
    show_ckpt = {**show, "ADAPTER": str(ckpt)}
    assert run_checked(EXPORT_SCHEMA, show_ckpt, ns["run"], "export.py") == 0
    assert "ss_steps: 1" in capsys.readouterr().out
