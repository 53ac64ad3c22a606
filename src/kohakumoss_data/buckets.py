"""Optional fixed bucket sets (kohya style): each image goes to the bucket nearest its aspect ratio."""

from __future__ import annotations

import math
from collections.abc import Sequence


def kohya_buckets(
    area: int, min_side: int = 256, max_side: int = 2048, step: int = 64
) -> list[tuple[int, int]]:
    """kohya's make_bucket_resolutions: for each width, the tallest height (a multiple of `step`) in `area`."""
    out = set()
    for width in range(min_side, max_side + 1, step):
        height = min(max_side, (area // width) // step * step)
        if height >= min_side:
            out.add((width, height))
            out.add((height, width))
    return sorted(out)


def nearest_bucket(
    width: int, height: int, buckets: Sequence[Sequence[int]], no_upscale: bool = False
) -> tuple[int, int] | None:
    """The bucket with the closest log aspect ratio (larger area breaks ties); None if none fits."""
    candidates = [(int(b[0]), int(b[1])) for b in buckets]
    if no_upscale:
        candidates = [b for b in candidates if max(b[0] / width, b[1] / height) <= 1.0]
    if not candidates:
        return None
    log_aspect = math.log(width / height)
    return min(candidates, key=lambda b: (abs(math.log(b[0] / b[1]) - log_aspect), -b[0] * b[1], b))
