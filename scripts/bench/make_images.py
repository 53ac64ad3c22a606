"""Write N synthetic images with captions as a kohya folder (smoke runs where no dataset exists).

python scripts/bench/make_images.py OUT_DIR [N] [SIZE] [WORDS]

WORDS: caption words per image, "3-40" (the default: real captions differ in length, so each batch's
text has its own length) or one count ("256": every caption that long, as the step benchmark's text).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = ["red", "blue", "green", "gold", "stripes", "waves", "grid", "dots", "soft", "sharp"]


def caption_words(spec: str) -> tuple[int, int]:
    """'3-40' -> (3, 40); '256' -> (256, 256)."""
    low, _, high = spec.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise SystemExit(f"WORDS: '{spec}' is not a count or a range like 3-40") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise SystemExit(f"WORDS: '{spec}' needs 1 <= low <= high")
    return bounds


def main() -> None:
    out, n, size = (
        Path(sys.argv[1]),
        int(sys.argv[2]) if len(sys.argv) > 2 else 16,
        int(sys.argv[3]) if len(sys.argv) > 3 else 1024,
    )
    low, high = caption_words(sys.argv[4] if len(sys.argv) > 4 else "3-40")
    folder = out / "1_smoke"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(n):
        f = rng.uniform(2, 12, 3)
        img = np.stack([np.sin(f[c] * (xx + (c + 1) * yy) + i) for c in range(3)], -1) * 0.4 + 0.5
        img += rng.normal(0, 0.05, img.shape)
        Image.fromarray((img.clip(0, 1) * 255).astype(np.uint8)).save(folder / f"img_{i:03d}.jpg", quality=90)
        (folder / f"img_{i:03d}.txt").write_text(
            " ".join(rng.choice(WORDS, int(rng.integers(low, high + 1))))
        )
    print(f"{n} images of {size}x{size} in {folder}")


if __name__ == "__main__":
    main()
