"""Per-image target resolution: native aspect, within an area budget, a multiple of 16 px, aspect limits."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """Resize the upright image to `resize`, then crop `target` at offset `crop` (x, y)."""

    target: tuple[int, int]
    resize: tuple[int, int]
    crop: tuple[int, int] = (0, 0)


def _floor_to(value: float, multiple: int) -> int:
    return max(multiple, int(math.floor(value / multiple + 1e-9)) * multiple)


def target_size(
    width: int,
    height: int,
    area: int,
    multiple: int,
    min_aspect: float,
    max_aspect: float,
    no_upscale: bool = False,
) -> tuple[int, int]:
    """(w, h), multiples of `multiple`, at the image's aspect (clamped) with w*h <= area."""
    aspect = min(max(width / height, min_aspect), max_aspect)
    budget = min(area, width * height) if no_upscale else area
    tw = _floor_to(math.sqrt(budget * aspect), multiple)
    th = _floor_to(math.sqrt(budget / aspect), multiple)
    if no_upscale:
        scale = max(tw / width, th / height)
        if scale > 1:
            tw, th = _floor_to(tw / scale, multiple), _floor_to(th / scale, multiple)
    return tw, th


def cover_size(width: int, height: int, target: tuple[int, int]) -> tuple[int, int]:
    """The smallest size at the image's own aspect that covers `target` (resize before crop)."""
    tw, th = target
    scale = max(tw / width, th / height)
    return max(tw, round(width * scale)), max(th, round(height * scale))


def crop_offset(
    resize: tuple[int, int], target: tuple[int, int], mode: str, u: tuple[float, float]
) -> tuple[int, int]:
    """Center crop, or a random one from the uniform pair `u` in [0,1)."""
    spare_x, spare_y = resize[0] - target[0], resize[1] - target[1]
    if mode == "center":
        return spare_x // 2, spare_y // 2
    return int(u[0] * (spare_x + 1)), int(u[1] * (spare_y + 1))
