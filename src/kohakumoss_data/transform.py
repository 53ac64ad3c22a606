"""Make the planned pixels of one item: decode, resize to cover, crop, flip (Pillow only)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from .decode import open_image, to_rgb, upright_size
from .plan import PlannedItem

_RESAMPLE = Image.Resampling.LANCZOS


def _draft(image: Image.Image, resize: tuple[int, int]) -> None:
    """Let libjpeg decode at a reduced scale that still covers the planned size (much faster)."""
    if image.format != "JPEG":
        return
    up_w, up_h = upright_size(image)
    swapped = (up_w, up_h) != image.size
    want = (resize[1], resize[0]) if swapped else resize
    image.draft("RGB", want)


def planned_pixels(data: bytes | Image.Image, item: PlannedItem) -> np.ndarray:
    """uint8 [H, W, 3] of exactly `item.target`, as the plan says (a reference: `plan.reference_item`)."""
    image = open_image(data)
    _draft(image, item.resize)
    image = to_rgb(image)
    if image.size != item.resize:
        image = image.resize(item.resize, _RESAMPLE, reducing_gap=3.0)
    x, y = item.crop
    image = image.crop((x, y, x + item.target[0], y + item.target[1]))
    if item.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image, dtype=np.uint8)


def to_chw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


def to_model_range(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [.., 3, H, W] -> float [-1, 1]."""
    return pixels.float().div(127.5).sub(1.0)
