"""Loss masks: an item's alpha channel or mask file, put through the item's planned resize, crop and flip,
then averaged over each image token's 16 x 16 pixels (the latent token grid the loss is taken on)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from kohakumoss_common.errors import DataError

from .decode import _has_alpha, open_image
from .plan import PlannedItem

_RESAMPLE = Image.Resampling.BILINEAR


def mask_image(data: bytes | Image.Image, item: PlannedItem) -> Image.Image:
    """The upright 8-bit mask of one item before resizing (255: trains, 0: ignored)."""
    if item.mask == "alpha":
        image = ImageOps.exif_transpose(open_image(data))
        if not _has_alpha(image):
            return Image.new("L", image.size, 255)  # nothing transparent: every pixel trains
        return image.convert("RGBA").getchannel("A")
    try:
        return ImageOps.exif_transpose(open_image(Path(item.mask).read_bytes())).convert("L")
    except (OSError, ValueError) as e:
        raise DataError(f"{item.key}: mask file {item.mask} cannot be read ({type(e).__name__}: {e})") from e


def planned_mask(data: bytes | Image.Image, item: PlannedItem, patch_px: int) -> np.ndarray:
    """float32 [target_h / patch_px, target_w / patch_px] in [0, 1], aligned with the item's image tokens."""
    mask = mask_image(data, item)
    if mask.size != item.resize:  # a mask file of another size is stretched over the image
        mask = mask.resize(item.resize, _RESAMPLE)
    x, y = item.crop
    mask = mask.crop((x, y, x + item.target[0], y + item.target[1]))
    if item.flip:
        mask = mask.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    grid = (item.target[0] // patch_px, item.target[1] // patch_px)
    tokens = mask.resize(grid, Image.Resampling.BOX)  # the mean of each token's pixels
    return np.asarray(tokens, dtype=np.float32) / 255.0


def missing_masks(items: list[PlannedItem]) -> list[str]:
    """Mask files the plan names that do not exist (checked before the first step)."""
    files = sorted({it.mask for it in items if it.mask not in ("", "alpha")})
    return [f for f in files if not Path(f).is_file()]
