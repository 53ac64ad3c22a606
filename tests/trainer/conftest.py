"""A tiny world for training tests: real wallpaper crops in a kohya folder, tiny encoders on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from kohakumoss.encoders.tiny import write_tiny_text_encoder, write_tiny_vae

WALLPAPERS = Path("/usr/share/backgrounds/gnome")
DEMO_IMAGES = Path(__file__).resolve().parents[2] / "assets" / "demo" / "images" / "1_demo"
PICKS = {
    "adwaita-l.webp": "blue glass hexagons",
    "grid-l.webp": "golden square grid",
    "truchet-l.webp": "orange truchet tiles",
    "wood-l.webp": "brown wood planks",
}
SIZE = 64


@pytest.fixture(scope="session")
def train_world(tmp_path_factory) -> dict[str, str]:
    sources = [WALLPAPERS / n for n in PICKS]
    if not all(p.exists() for p in sources):  # e.g. the GPU machine: the demo's four pictures instead
        sources = [DEMO_IMAGES / f"{n}.jpg" for n in ("astronaut", "cat", "coffee", "rocket")]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        pytest.skip(f"real images missing ({missing}): apt-get install -y gnome-backgrounds")
    root = tmp_path_factory.mktemp("world")
    data = root / "data" / "2_style"
    data.mkdir(parents=True)
    for source, (name, caption) in zip(sources, PICKS.items()):
        im = Image.open(source).convert("RGB")
        im.draft("RGB", (256, 256))
        im = im.resize((SIZE, SIZE), Image.Resampling.LANCZOS)
        stem = name.split(".")[0]
        im.save(data / f"{stem}.png")
        (data / f"{stem}.txt").write_text(caption)
    text = write_tiny_text_encoder(root / "text", PICKS.values())
    vae = write_tiny_vae(root / "vae")
    return {
        "DATASET": {"kind": "kohya", "path": str(root / "data")},
        "TEXT_ENCODER": text.path,
        "TOKENIZER": text.tokenizer_path,
        "TEXT_TEMPLATE": text.template,
        "VAE": str(vae),
        "root": str(root),
    }


def tiny_knobs(world: dict, run_name: str, **overrides) -> dict:
    """Validated knobs of a few-step LoRA run of the tiny preset on the CPU."""
    from kohakumoss.config.train import TRAIN_SCHEMA

    knobs = {k: v for k, v in world.items() if k != "root"}
    knobs.update(
        MODEL_PRESET="tiny",
        DEVICE="cpu",
        PRECISION="fp32",
        OPS_BACKEND="eager",
        RANK=4,
        ALPHA=4.0,
        LR=1e-3,
        STEPS=6,
        AREA=SIZE * SIZE,
        MIN_SIDE=32,
        TOKENS_PER_STEP=2 * (SIZE * SIZE // 256 + 16),
        MAX_TEXT_TOKENS=16,
        WORKERS=0,
        CACHE_DIR=str(Path(world["root"]) / "cache"),
        RUNS_DIR=str(Path(world["root"]) / "runs"),
        RUN_NAME=run_name,
        SAVE_EVERY=0,
        SAMPLE_EVERY=0,
        SAMPLE_STEPS=2,
        SAMPLE_WIDTH=32,
        SAMPLE_HEIGHT=32,
    )
    knobs.update(overrides)
    return TRAIN_SCHEMA.validate(knobs)
