"""The embedded demo, run end to end with its default knobs (what the README's command runs, on the CPU):
it writes its run folder, and the LoRA row of its grid is closer to the training pictures than the base
row. About 80 s on this project's 2-core CPU machine (the demo trains on one thread).

Measured on the released structure (defaults: 450 steps, rank 32, LR 3e-3, seed 0, grid at CFG 3 and
shift 1; one thread, so the run is bitwise reproducible on a machine): colour-histogram L1 distance base
1.620 -> LoRA 0.993, 16 px pixel MSE base 0.0636 -> LoRA 0.0423. On two threads float sums are reordered
and the LoRA row drifted from run to run (0.99 to 1.50). The same run sampled without guidance (CFG 1)
gets 1.374 and 0.0648. The test asks for at least 20% lower histogram distance and a lower 16 px MSE."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "assets" / "demo" / "images" / "1_demo"
DEMO = ROOT / "scripts" / "demo" / "demo.py"
KNOBS = ("RUN_NAME", "RUNS_DIR", "STEPS", "LR", "RANK", "DEVICE", "SEED", "SAMPLE_STEPS")


@pytest.fixture(scope="module")
def demo():
    return runpy.run_path(str(DEMO), run_name="kohakumoss_test")


def test_the_default_demo_runs_and_its_lora_row_resembles_the_training_pictures(demo, tmp_path):
    knobs = {name: demo[name] for name in KNOBS} | {"RUNS_DIR": str(tmp_path), "DEVICE": "cpu"}
    near = demo["run"](knobs)
    run, steps = tmp_path / knobs["RUN_NAME"], int(knobs["STEPS"])
    assert (run / "log.txt").read_text().strip()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    grid = run / "samples" / f"grid_step_{steps:08d}.png"
    assert Image.open(grid).size[1] > 2 * 128  # two rows
    assert sorted(p.name for p in (run / "export").iterdir()) == [
        "demo-comfy.safetensors",
        "lycoris",
    ]
    assert not list(IMAGES.parent.glob(".*catalog*"))  # the catalog stays in the run folder
    print(f"distance to the training pictures: {near}")
    # an untrained LoRA is the base row exactly (ratio 1.0, same seeds per column); a trained one came
    # 0.69 to 0.83 of it over SEED 0, 1, 2 (CPU, the build drawing nothing from the global generator): the
    # four-picture measure varies with the adapter's initial draw, so the margin is 10%
    assert near["lora"]["hist"] < 0.9 * near["base"]["hist"], near
    assert near["lora"]["mse16"] < near["base"]["mse16"], near


def test_the_resemblance_measure_pairs_each_sample_with_its_prompts_picture(demo, tmp_path):
    pictures = sorted(IMAGES.glob("*.jpg"))
    a, b = Image.open(pictures[0]), Image.open(pictures[1])
    assert demo["picture_distances"](a, a) == {"hist": 0.0, "mse16": 0.0}
    apart = demo["picture_distances"](a, b)
    assert apart["hist"] > 0.3 and apart["mse16"] > 0.01
    # a fake run: the 'LoRA' row is the training pictures themselves, the base row is grey
    (tmp_path / "samples" / "base").mkdir(parents=True)
    (tmp_path / "samples" / "step_00000007").mkdir()
    for i, path in enumerate(pictures):
        Image.new("RGB", (128, 128), (128, 128, 128)).save(
            tmp_path / "samples" / "base" / f"base_{i:02d}.png"
        )
        Image.open(path).save(tmp_path / "samples" / "step_00000007" / f"sample_{i:02d}.png")
    near = demo["resemblance"](tmp_path, {str(i): p for i, p in enumerate(pictures)}, 7)
    assert near["lora"]["hist"] < 0.01 and near["lora"]["mse16"] < 1e-3 < near["base"]["mse16"], near
    shuffled = demo["resemblance"](tmp_path, {str(i): p for i, p in enumerate(pictures[::-1])}, 7)
    assert shuffled["lora"]["hist"] > 0.3, shuffled  # the wrong picture per prompt is far


def test_demo_assets_have_captions_and_a_vae():
    pictures = sorted(IMAGES.glob("*.jpg"))
    assert len(pictures) == 4 and all(p.with_suffix(".txt").read_text().strip() for p in pictures)
    assert len({p.with_suffix(".txt").read_text().strip() for p in pictures}) == 4  # one picture per prompt
    assert (ROOT / "assets" / "demo" / "vae" / "config.json").exists()


@pytest.mark.gpu
def test_the_demo_runs_on_the_gpu_with_its_default_device(demo, tmp_path):
    """DEVICE='auto' (the README's command) picks CUDA when there is one; the picture check holds there too."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    knobs = {name: demo[name] for name in KNOBS} | {"RUNS_DIR": str(tmp_path)}
    assert knobs["DEVICE"] == "auto"
    near = demo["run"](knobs)
    log = (tmp_path / knobs["RUN_NAME"] / "log.txt").read_text()
    assert "device cuda" in log, log[:2000]
    # an untrained LoRA is the base row exactly (ratio 1.0, same seeds per column); a trained one came
    # 0.69 to 0.83 of it over SEED 0, 1, 2 (CPU, the build drawing nothing from the global generator): the
    # four-picture measure varies with the adapter's initial draw, so the margin is 10%
    assert near["lora"]["hist"] < 0.9 * near["base"]["hist"], near
