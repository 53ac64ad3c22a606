"""Helpers for sources backed by image files on disk: listing, sidecar captions, stat signatures."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from kohakumoss_common.errors import DataError

from ..captions import MAX_CAPTION_BYTES

DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".jxl", ".avif")
DEFAULT_CAPTION_EXTENSIONS = (".txt", ".caption")
# sidecar extensions that hold captions in the tools people train with: one beside every image while
# caption_extension names another is a setting gone wrong, not an uncaptioned dataset
CAPTION_LIKE = (".txt", ".caption", ".tags", ".text", ".cap")


def normalize_extensions(exts: str | Iterable[str]) -> tuple[str, ...]:
    """'.txt' or ['txt', '.caption'] -> ('.txt', '.caption'), lower case with a dot."""
    items = [exts] if isinstance(exts, str) else list(exts)
    return tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in items)


BROKEN_SYMLINK = "broken_symlink"
SYMLINK_LOOP = "symlink_loop"
DIR_SEEN = "dir_already_scanned"
UNREADABLE = "unreadable_file"
UNREADABLE_DIR = "unreadable_folder"
NOT_A_FILE = "not_a_file"  # a FIFO, device or socket: opening or reading it could block or never end
NAME_NOT_UTF8 = "name_not_utf8"


def list_images(folder: Path, extensions: tuple[str, ...], recursive: bool) -> Iterator[Path]:
    """Image files under `folder` in a stable (sorted) order; hidden files and folders are skipped."""
    for path, fault in walk_images(folder, extensions, recursive):
        if not fault:
            yield path


def readable_name(path: Path | str) -> str:
    """`path` as text that encodes: bytes that are not UTF-8 shown as \\xNN (names the file in reports)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def name_is_utf8(name: str) -> bool:
    """False for a name the file system holds as bytes that are not UTF-8 (Python keeps them as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sorted_entries(folder: Path) -> list[Path]:
    """The entries of `folder` by name (raises OSError for a folder that cannot be listed)."""
    with os.scandir(folder) as entries:
        return [folder / name for name in sorted(e.name for e in entries)]


def walk_images(
    folder: Path, extensions: tuple[str, ...], recursive: bool, seen: set[str] | None = None
) -> Iterator[tuple[Path, str]]:
    """(path, fault) in sorted order; fault is "" or why the entry cannot be used (a recorded drop).

    Directory symlinks are followed once: a folder whose real path was already walked is a fault,
    so loops end and no image is listed twice. A folder that cannot be listed, a name that is not
    UTF-8 and an image name that is not a regular file (FIFO, device) are faults too, found by stat
    before anything is opened.
    """
    seen = set() if seen is None else seen
    seen.add(os.path.realpath(folder))
    try:
        entries = sorted_entries(folder)
    except OSError:
        yield folder, UNREADABLE_DIR
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        wanted = entry.suffix.lower() in extensions
        fault = entry_fault(entry)
        if fault in (BROKEN_SYMLINK, SYMLINK_LOOP, UNREADABLE):
            if wanted or entry.is_symlink():
                yield entry, fault
        elif entry.is_dir():
            if not recursive:
                continue
            if not name_is_utf8(entry.name):
                yield entry, NAME_NOT_UTF8
            elif os.path.realpath(entry) in seen:
                yield entry, DIR_SEEN
            else:
                yield from walk_images(entry, extensions, recursive, seen)
        elif wanted:
            yield entry, fault or (NAME_NOT_UTF8 if not name_is_utf8(entry.name) else "")


def entry_fault(path: Path) -> str:
    """ "" for a reachable regular file or folder, else broken_symlink, symlink_loop, unreadable_file or
    not_a_file (by stat: the entry is never opened)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return SYMLINK_LOOP
        return BROKEN_SYMLINK if path.is_symlink() else UNREADABLE
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return NOT_A_FILE
    return ""


def path_fault(path: Path) -> str:
    """The walk's fault for an entry it listed (what `walk_images` yielded with it), found again."""
    fault = entry_fault(path)
    if fault:
        return fault
    if not name_is_utf8(path.name):
        return NAME_NOT_UTF8
    if path.is_dir():
        try:
            sorted_entries(path)
        except OSError:
            return UNREADABLE_DIR
        return DIR_SEEN
    return ""


def fault_reason(path: Path, fault: str) -> str:
    """A readable reason for a walk fault."""
    if fault == DIR_SEEN:
        return f"folder {readable_name(os.path.realpath(path))} was already scanned (directory symlink, followed once)"
    if fault == SYMLINK_LOOP:
        return "symlink loop"
    if fault == BROKEN_SYMLINK:
        return f"symlink target {readable_name(os.readlink(path))} does not exist"
    if fault == NOT_A_FILE:
        return f"not a regular file ({file_type(path)}): skipped without opening it"
    if fault == NAME_NOT_UTF8:
        return f"name '{readable_name(path.name)}' is not valid UTF-8: rename it to train it"
    if fault == UNREADABLE_DIR:
        try:
            sorted_entries(path)
        except OSError as e:
            return f"folder cannot be listed ({type(e).__name__}: {e.strerror or e}): its images are skipped"
        return "folder cannot be listed: its images are skipped"
    return "file cannot be read"


def file_type(path: Path) -> str:
    """What a non-regular entry is, in words (follows symlinks)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "unknown"
    for check, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if check(mode):
            return name
    return "not a regular file"


def find_sidecar(image: Path, caption_extensions: tuple[str, ...]) -> Path | None:
    """`photo.txt` beside `photo.jpg` (the first extension that exists wins)."""
    for ext in caption_extensions:
        candidate = image.with_suffix(ext)
        if candidate.is_file():
            return candidate
    return None


def read_regular(path: Path) -> bytes:
    """A file's bytes; a FIFO or device put where an image was scanned is named, never opened (it may block)."""
    if entry_fault(path) == NOT_A_FILE:
        raise DataError(f"{readable_name(path)}: {fault_reason(path, NOT_A_FILE)}")
    return path.read_bytes()


def read_caption_file(path: Path) -> bytes:
    """A sidecar's bytes, read no further than one byte past the caption bound (`captions.MAX_CAPTION_BYTES`):
    a huge file is judged by size without reading it whole."""
    with open(path, "rb") as f:
        return f.read(MAX_CAPTION_BYTES + 1)


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
