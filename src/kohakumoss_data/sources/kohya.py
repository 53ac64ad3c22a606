"""kohya-style folders: `<repeats>_<name>` subfolders, each image with a `.txt` / `.caption` sidecar."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from kohakumoss_common.errors import DataError
from kohakumoss_common.log import get_logger

from .files import DEFAULT_CAPTION_EXTENSIONS, DEFAULT_EXTENSIONS, NAME_NOT_UTF8, name_is_utf8, walk_images
from .folder import FolderSource

_REPEATS_DIR = re.compile(r"^(\d+)_(.+)$")
log = get_logger(__name__)


def parse_repeats(folder_name: str) -> int | None:
    """'10_cat' -> 10; None for a folder that does not follow the pattern."""
    match = _REPEATS_DIR.match(folder_name)
    return int(match.group(1)) if match else None


class KohyaSource(FolderSource):
    kind = "kohya"

    def __init__(
        self,
        path: str | Path,
        caption_extension: str | Iterable[str] = DEFAULT_CAPTION_EXTENSIONS,
        extensions: Iterable[str] = DEFAULT_EXTENSIONS,
        recursive: bool = False,
        references: str | Path | None = None,
    ):
        super().__init__(path, caption_extension, extensions, recursive, repeats=1, references=references)
        self._subdirs = self._repeat_dirs()
        if not self._subdirs:
            raise DataError(f"{self.path}: no '<repeats>_<name>' subfolder (kohya layout), e.g. '10_cat'")

    def _repeat_dirs(self) -> dict[str, int]:
        out = {}
        for sub in sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            repeats = parse_repeats(sub.name)
            if repeats is None:
                log.warning("%s: skipped, folder name is not '<repeats>_<name>'", sub)
                continue
            out[sub.name] = repeats
        return out

    def _images(self) -> Iterator[tuple[Path, str]]:
        seen: set[str] = set()
        for name in self._subdirs:
            if not name_is_utf8(name):  # a drop like any other entry named in bytes that are not UTF-8
                yield self.path / name, NAME_NOT_UTF8
                continue
            yield from walk_images(self.path / name, self.extensions, self.recursive, seen)

    def repeats_for(self, rel: str) -> int:
        return self._subdirs[rel.split("/", 1)[0]]
