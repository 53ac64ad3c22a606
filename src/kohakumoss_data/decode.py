"""Decode any image Pillow reads into 8-bit RGB, upright: EXIF rotation, CMYK, 16-bit, palette, alpha."""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps

# Orientations 5-8 swap width and height.
_SWAPPING_ORIENTATIONS = {5, 6, 7, 8}
_EXIF_ORIENTATION = 0x0112


def open_image(data: bytes | Image.Image, max_pixels: int | None = None) -> Image.Image:
    """Open bytes with Pillow; our own `max_pixels` check replaces Pillow's global bomb limit."""
    if isinstance(data, Image.Image):
        return data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        old = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            image = Image.open(io.BytesIO(data))
        finally:
            Image.MAX_IMAGE_PIXELS = old
    if max_pixels is not None and image.width * image.height > max_pixels:
        raise Image.DecompressionBombError(f"{image.width}x{image.height} is over {max_pixels} pixels")
    return image


def upright_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) after applying the EXIF orientation, without decoding pixels."""
    w, h = image.size
    return (h, w) if swaps_sides(image) else (w, h)


def swaps_sides(image: Image.Image) -> bool:
    """True when the EXIF orientation turns the image by 90 degrees (a PNG's EXIF may load its pixels)."""
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block is not worth dropping the image for
        orientation = 1
    return orientation in _SWAPPING_ORIENTATIONS


def _high_bit_to_l(image: Image.Image) -> Image.Image:
    """16/32-bit grayscale scaled (not clipped) to 8 bits."""
    arr = np.asarray(image).astype(np.float64)
    top = 65535.0 if arr.max(initial=0) > 255 or image.mode.startswith("I;16") else 255.0
    if image.mode == "F":
        top = 1.0 if arr.max(initial=0) <= 1.0 else arr.max()
    return Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8))


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info


def to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """An upright 8-bit RGB copy; transparent pixels are composited over `background`."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        image = _high_bit_to_l(image)
    if _has_alpha(image):
        rgba = image.convert("RGBA")
        base = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(base, rgba).convert("RGB")
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def decode_rgb(data: bytes | Image.Image, max_pixels: int | None = None) -> Image.Image:
    """Bytes (or an already decoded image) -> upright 8-bit RGB."""
    image = open_image(data, max_pixels)
    image.load()
    return to_rgb(image)
