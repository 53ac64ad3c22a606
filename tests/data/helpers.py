"""Helpers for the data tests: real wallpaper photos (Debian package gnome-backgrounds) and broken files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

WALLPAPERS = Path("/usr/share/backgrounds/gnome")
APT_HINT = "install the Debian package: apt-get install -y gnome-backgrounds"
# Crops of the (square) wallpapers at varied aspect ratios, kept small so the tests stay fast.
SIZES = [(320, 240), (240, 320), (400, 200), (256, 256), (300, 180), (180, 300), (352, 224), (224, 352)]


def wallpaper_files() -> list[Path]:
    return (
        sorted(WALLPAPERS.glob("*.webp"))
        + sorted(WALLPAPERS.glob("*.jpg"))
        + sorted(WALLPAPERS.glob("*.png"))
    )


def encoded(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def write_photo(folder: Path, stem: str, image: Image.Image, caption: str | None, fmt: str = "JPEG") -> Path:
    ext = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}[fmt]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}{ext}"
    path.write_bytes(encoded(image, fmt))
    if caption is not None:
        (folder / f"{stem}.txt").write_text(caption, encoding="utf-8")
    return path


def caption_for(i: int) -> str:
    return f"a wallpaper photo number {i}, high detail"


def make_broken(folder: Path, photo: Image.Image) -> dict[str, str]:
    """Deliberately bad or unusual files; returns {file name: expected status}."""
    folder.mkdir(parents=True, exist_ok=True)
    jpeg = encoded(photo, "JPEG")
    (folder / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.png").write_text("this is not an image\n")
    photo.convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    arr16 = (np.asarray(photo.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    Image.fromarray(arr16).save(folder / "gray16.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    photo.save(folder / "rotated.jpg", quality=95, exif=exif)
    photo.convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.png", transparency=0)
    rgba = photo.convert("RGBA")
    rgba.putalpha(128)
    rgba.save(folder / "alpha.png")
    photo.resize((40, 30)).save(folder / "tiny.jpg")
    photo.save(folder / "badcaption.jpg")
    (folder / "badcaption.txt").write_bytes(b"caf\xe9 latin-1 caption")
    return {
        "truncated.jpg": "truncated",
        "empty.jpg": "zero_byte",
        "text.png": "unsupported_format",
        "cmyk.jpg": "ok",
        "gray16.png": "ok",
        "rotated.jpg": "ok",
        "palette.png": "ok",
        "alpha.png": "ok",
        "tiny.jpg": "too_small",
        "badcaption.jpg": "caption_not_utf8",
    }
