"""Helpers for sources backed by image files on disk: listing, sidecar captions, stat signatures."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".jxl", ".avif")
DEFAULT_CAPTION_EXTENSIONS = (".txt", ".caption")


def normalize_extensions(exts: str | Iterable[str]) -> tuple[str, ...]:
    """'.txt' or ['txt', '.caption'] -> ('.txt', '.caption'), lower case with a dot."""
    items = [exts] if isinstance(exts, str) else list(exts)
    return tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in items)


def list_images(folder: Path, extensions: tuple[str, ...], recursive: bool) -> Iterator[Path]:
    """Image files under `folder` in a stable (sorted) order; hidden files and folders are skipped."""
    entries = sorted(folder.iterdir(), key=lambda p: p.name)
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if recursive:
                yield from list_images(entry, extensions, recursive)
        elif entry.suffix.lower() in extensions:
            yield entry


def find_sidecar(image: Path, caption_extensions: tuple[str, ...]) -> Path | None:
    """`photo.txt` beside `photo.jpg` (the first extension that exists wins)."""
    for ext in caption_extensions:
        candidate = image.with_suffix(ext)
        if candidate.is_file():
            return candidate
    return None


def stat_signature(*paths: Path | None) -> str:
    """Size and mtime of each file: changes when any of them is edited, added or removed."""
    parts = []
    for path in paths:
        if path is None:
            parts.append("-")
            continue
        st = os.stat(path)
        parts.append(f"{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)
