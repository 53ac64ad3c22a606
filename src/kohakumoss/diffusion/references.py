"""Reference images of an edit request: read, sized as training sizes them, VAE-encoded to token grids.

As the data plan sizes a training reference (kohakumoss_data's `plan_reference`): about the target's
area at the reference's own aspect (clamped to 1:4..4:1), each side a multiple of 16 px, resized to
cover (LANCZOS) and centre-cropped; then VAE mode, normalized, patchified like a target: one
[128, rows, cols] token grid per reference (`model.pack_references` packs them). The text encoder's
copy of each reference is the image as read (it downscales its own, text_vision.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from kohakumoss.encoders.latents import patchify_channels
from kohakumoss_common.errors import ConfigError
from kohakumoss_data.decode import to_rgb
from kohakumoss_data.plan import PlanKnobs
from kohakumoss_data.resolution import cover_size, crop_offset, target_size
from kohakumoss_data.transform import to_model_range

PIXELS_PER_TOKEN = 16


def read_reference(path: str | Path, knob: str = "REFERENCE_IMAGES") -> Image.Image:
    """An RGB image (EXIF orientation applied), or a ConfigError naming `knob` and the file."""
    try:
        with Image.open(Path(path).expanduser()) as image:
            return to_rgb(image).copy()
    except (OSError, UnidentifiedImageError) as e:
        raise ConfigError(knob, f"reference image '{path}' cannot be read ({e})") from None


def reference_pixels(image: Image.Image, target: tuple[int, int]) -> torch.Tensor:
    """uint8 [3, h, w] of `image` at about `target`'s (width, height) area, as training sizes references."""
    w, h = image.size
    # the aspect clamp of training's own images (the plan's defaults)
    size = target_size(
        w, h, target[0] * target[1], PIXELS_PER_TOKEN, PlanKnobs.min_aspect, PlanKnobs.max_aspect
    )
    resize = cover_size(w, h, size)
    x, y = crop_offset(resize, size, "center", (0.0, 0.0))
    if image.size != resize:
        image = image.resize(resize, Image.Resampling.LANCZOS, reducing_gap=3.0)
    image = image.crop((x, y, x + size[0], y + size[1]))
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


@torch.no_grad()
def reference_grids(vae, images: Sequence[Image.Image], target: tuple[int, int]) -> list[torch.Tensor]:
    """One [128, rows, cols] float32 token grid per reference (normalized latents, patchified)."""
    out = []
    for image in images:
        pixels = to_model_range(reference_pixels(image, target))[None]
        latents = vae.encode(pixels).float().cpu()
        out.append(patchify_channels(latents)[0])
    return out
