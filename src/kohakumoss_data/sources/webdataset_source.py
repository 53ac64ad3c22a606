"""webdataset tar shards, grouped into samples by the `webdataset` package; reads seek by member offset."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from webdataset import tariterators

from kohakumoss_common.errors import DataError

from ..records import RawItem, Unit
from .base import Source
from .files import stat_signature

DEFAULT_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "jxl", "avif", "bmp", "tif", "tiff")


def tar_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.rglob("*.tar"))
        if files:
            return files
    raise DataError(f"{path}: no webdataset .tar shard here")


def member_offsets(tar: Path) -> dict[str, tuple[int, int]]:
    """{member name: (data offset, size)} so one image is read with a single seek."""
    with tarfile.open(tar) as tf:
        return {m.name: (m.offset_data, m.size) for m in tf.getmembers() if m.isfile()}


class WebDatasetSource(Source):
    kind = "webdataset"

    def __init__(
        self,
        path: str | Path,
        image_exts: Iterable[str] = DEFAULT_IMAGE_EXTS,
        caption_ext: str = "txt",
    ):
        super().__init__(path)
        self.image_exts = tuple(e.lstrip(".").lower() for e in image_exts)
        self.caption_ext = caption_ext.lstrip(".")
        self._tars = tar_files(self.path)
        self._offsets: dict[str, dict[str, tuple[int, int]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_offsets": {}}

    def _rel(self, tar: Path) -> str:
        return tar.relative_to(self.path).as_posix() if self.path.is_dir() else tar.name

    def _tar(self, rel: str) -> Path:
        return self.path / rel if self.path.is_dir() else self.path

    def units(self) -> Iterator[Unit]:
        for tar in self._tars:
            yield Unit(self._rel(tar), stat_signature(tar))

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        tar = self._tar(unit_id)
        for sample in tariterators.tarfile_samples([{"url": str(tar)}]):
            ext = next((e for e in self.image_exts if e in sample), None)
            if ext is None:
                continue
            key = sample["__key__"]
            caption = sample.get(self.caption_ext)
            yield RawItem(
                key=f"{unit_id}:{key}",
                unit=unit_id,
                locator=[unit_id, f"{key}.{ext}"],
                data=sample[ext],
                captions=[caption] if caption is not None else None,
                name=Path(key).name,
            )

    def read(self, locator: list) -> bytes:
        rel, member = locator
        if rel not in self._offsets:
            self._offsets[rel] = member_offsets(self._tar(rel))
        offset, size = self._offsets[rel][member]
        with open(self._tar(rel), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def spec(self) -> dict:
        return {**super().spec(), "image_exts": self.image_exts, "caption_ext": self.caption_ext}
