"""The embedded demo's mechanics, shortened: it runs from the shipped assets and writes its run folder."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_from_shipped_assets(tmp_path):
    ns = runpy.run_path(str(ROOT / "scripts" / "demo" / "demo.py"), run_name="kohakumoss_test")
    knobs = {
        "RUN_NAME": "demo",
        "RUNS_DIR": str(tmp_path),
        "STEPS": 4,
        "LR": 3e-3,
        "RANK": 8,
        "DEVICE": "cpu",
        "SEED": 0,
        "SAMPLE_STEPS": 2,
    }
    ns["run"](knobs)
    run = tmp_path / "demo"
    assert (run / "log.txt").exists() and len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert (run / "samples" / "grid_step_00004.png").exists()
    assert sorted(p.name for p in (run / "export").iterdir()) == [
        "demo-comfy.safetensors",
        "demo-lycoris.safetensors",
    ]
    assert not list(
        (ROOT / "assets" / "demo" / "images").glob(".*catalog*")
    )  # the catalog stays in the run folder


def test_demo_assets_have_captions_and_a_vae():
    images = ROOT / "assets" / "demo" / "images" / "1_demo"
    pictures = sorted(images.glob("*.jpg"))
    assert len(pictures) == 4 and all(p.with_suffix(".txt").read_text().strip() for p in pictures)
    assert (ROOT / "assets" / "demo" / "vae" / "config.json").exists()
