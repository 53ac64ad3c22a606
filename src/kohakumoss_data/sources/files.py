"""Helpers for sources backed by image files on disk: listing, sidecar captions, stat signatures."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".jxl", ".avif")
DEFAULT_CAPTION_EXTENSIONS = (".txt", ".caption")


def normalize_extensions(exts: str | Iterable[str]) -> tuple[str, ...]:
    """'.txt' or ['txt', '.caption'] -> ('.txt', '.caption'), lower case with a dot."""
    items = [exts] if isinstance(exts, str) else list(exts)
    return tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in items)


BROKEN_SYMLINK = "broken_symlink"
SYMLINK_LOOP = "symlink_loop"
DIR_SEEN = "dir_already_scanned"
UNREADABLE = "unreadable_file"


def list_images(folder: Path, extensions: tuple[str, ...], recursive: bool) -> Iterator[Path]:
    """Image files under `folder` in a stable (sorted) order; hidden files and folders are skipped."""
    for path, fault in walk_images(folder, extensions, recursive):
        if not fault:
            yield path


def walk_images(
    folder: Path, extensions: tuple[str, ...], recursive: bool, seen: set[str] | None = None
) -> Iterator[tuple[Path, str]]:
    """(path, fault) in sorted order; fault is "" or why the entry cannot be used (a recorded drop).

    Directory symlinks are followed once: a folder whose real path was already walked is a fault,
    so loops end and no image is listed twice.
    """
    seen = set() if seen is None else seen
    seen.add(os.path.realpath(folder))
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        fault = entry_fault(entry)
        if fault in (BROKEN_SYMLINK, SYMLINK_LOOP):
            if entry.suffix.lower() in extensions or entry.is_symlink():
                yield entry, fault
        elif entry.is_dir():
            if not recursive:
                continue
            if os.path.realpath(entry) in seen:
                yield entry, DIR_SEEN
            else:
                yield from walk_images(entry, extensions, recursive, seen)
        elif entry.suffix.lower() in extensions:
            yield entry, ""


def entry_fault(path: Path) -> str:
    """ "" for a reachable entry, else broken_symlink or symlink_loop."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return SYMLINK_LOOP
        return BROKEN_SYMLINK if path.is_symlink() else UNREADABLE
    return ""


def fault_reason(path: Path, fault: str) -> str:
    """A readable reason for a walk fault."""
    if fault == DIR_SEEN:
        return f"folder {os.path.realpath(path)} was already scanned (directory symlink, followed once)"
    if fault == SYMLINK_LOOP:
        return "symlink loop"
    if fault == BROKEN_SYMLINK:
        return f"symlink target {os.readlink(path)} does not exist"
    return "file cannot be read"


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
