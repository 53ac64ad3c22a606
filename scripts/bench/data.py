"""Data loader throughput: decoded, resized and cropped images per second at 1 MP, per worker count.

    kogine run scripts/bench/data.py [--set WORKERS=1,2,4 --set IMAGES=48 --set DATA_DIR=...]
    python scripts/bench/data.py

Builds a kohya folder of ~1.2 MP JPEGs (from the gnome-backgrounds wallpapers when installed, else
a smooth synthetic pattern) in DATA_DIR (a temporary folder when empty) unless it already holds one,
plans every image at a 1 MP area budget, and times a full pass of the loader (no encoders: decode +
resize + crop + HostBatch, pinned when CUDA is present) with each worker count. Prints a table and
writes results.json under $OUT when set.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from kohakumoss_data import Loader, LoaderKnobs, PlanKnobs, ScanKnobs, build_plan, make_source, scan

WORKERS = "1,2,4"
IMAGES = 48
SOURCE_SIZE = (1280, 960)
AREA = 1024 * 1024
PREFETCH_STEPS = 4
DATA_DIR = ""  # '': a temporary folder; a path keeps the images for the next run (or another machine)
WALLPAPERS = "/usr/share/backgrounds/gnome"


def synthetic(i: int, size: tuple[int, int]) -> Image.Image:
    """A smooth, photo-like (compressible) pattern that differs per image."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = [np.sin(x / (40 + 7 * i + 13 * c)) * np.cos(y / (55 + 5 * c)) for c in range(3)]
    noise = np.random.default_rng(i).normal(0, 0.08, (h, w, 3))
    arr = (np.stack(rgb, -1) + noise) * 100 + 128
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def source_images(count: int, size: tuple[int, int]) -> list[Image.Image]:
    files = sorted(Path(WALLPAPERS).glob("*.webp")) if Path(WALLPAPERS).is_dir() else []
    files = [f for f in files if Image.open(f).width >= size[0]]
    bases = [Image.open(f).convert("RGB").resize(size, Image.Resampling.LANCZOS) for f in files[:count]]
    return [
        bases[i % len(bases)].rotate(180 * (i // len(bases) % 2)) if bases else synthetic(i, size)
        for i in range(count)
    ]


def build_dataset(root: Path, count: int, size: tuple[int, int]) -> Path:
    folder = root / "1_bench"
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(source_images(count, size)):
        image.save(folder / f"img{i:04d}.jpg", quality=92)
        (folder / f"img{i:04d}.txt").write_text(f"benchmark image {i}")
    return root


def time_pass(plan, catalog, source, workers: int) -> float:
    loader = Loader(plan, catalog, source, knobs=LoaderKnobs(workers=workers, prefetch_steps=PREFETCH_STEPS))
    start = time.perf_counter()
    n = sum(len(batch.pixels) for batch in loader)
    assert n == sum(len(s) for s in plan.steps)
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(DATA_DIR or tmp)
        if not (root / "1_bench").is_dir():
            build_dataset(root, IMAGES, tuple(SOURCE_SIZE))
        source = make_source({"kind": "kohya", "path": str(root)})
        catalog = scan(source, ScanKnobs(), cache_dir=tmp)
        plan = build_plan(catalog, 0, PlanKnobs(area=AREA, tokens_per_step=4 * AREA // 256))
        images = sum(len(s) for s in plan.steps)
        target = plan.steps[0][0].target
        print(
            f"{images} images {catalog.usable[0].width}x{catalog.usable[0].height} JPEG -> {target[0]}x{target[1]}, {os.cpu_count()} CPUs"
        )
        print(f"{'workers':>8} {'seconds':>8} {'images/s':>9}")
        rows = []
        for workers in [int(w) for w in str(WORKERS).split(",")]:
            seconds = time_pass(plan, catalog, source, workers)
            rows.append(
                {"workers": workers, "images": images, "seconds": seconds, "images_per_s": images / seconds}
            )
            print(f"{workers:>8} {seconds:>8.2f} {images / seconds:>9.1f}")
        if out := os.environ.get("OUT"):
            Path(out, "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
