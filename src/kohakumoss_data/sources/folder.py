"""Plain folders: images found recursively, each with an optional sidecar caption file."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from kohakumoss_common.errors import DataError

from ..records import RawItem, Unit
from .base import Source
from .files import (
    DEFAULT_CAPTION_EXTENSIONS,
    DEFAULT_EXTENSIONS,
    find_sidecar,
    list_images,
    normalize_extensions,
    stat_signature,
)


class FolderSource(Source):
    kind = "folder"

    def __init__(
        self,
        path: str | Path,
        caption_extension: str | Iterable[str] = DEFAULT_CAPTION_EXTENSIONS,
        extensions: Iterable[str] = DEFAULT_EXTENSIONS,
        recursive: bool = True,
        repeats: int = 1,
    ):
        super().__init__(path)
        if not self.path.is_dir():
            raise DataError(f"{self.path}: dataset folder does not exist")
        self.caption_extensions = normalize_extensions(caption_extension)
        self.extensions = normalize_extensions(extensions)
        self.recursive = recursive
        self.repeats = int(repeats)

    def _images(self) -> Iterator[tuple[Path, int]]:
        for image in list_images(self.path, self.extensions, self.recursive):
            yield image, self.repeats

    def units(self) -> Iterator[Unit]:
        for image, _ in self._images():
            sidecar = find_sidecar(image, self.caption_extensions)
            rel = image.relative_to(self.path).as_posix()
            yield Unit(rel, f"{stat_signature(image, sidecar)}|{sidecar.suffix if sidecar else ''}")

    def repeats_for(self, rel: str) -> int:
        return self.repeats

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        image = self.path / unit_id
        sidecar = find_sidecar(image, self.caption_extensions)
        captions = [sidecar.read_bytes()] if sidecar is not None else None
        yield RawItem(
            key=unit_id,
            unit=unit_id,
            locator=unit_id,
            data=image.read_bytes(),
            captions=captions,
            repeats=self.repeats_for(unit_id),
            name=image.stem,
        )

    def read(self, locator: str) -> bytes:
        return (self.path / locator).read_bytes()

    def spec(self) -> dict:
        return {
            **super().spec(),
            "captions": self.caption_extensions,
            "extensions": self.extensions,
            "recursive": self.recursive,
            "repeats": self.repeats,
        }
