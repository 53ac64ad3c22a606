"""webdataset tar shards, grouped into samples by the `webdataset` package; reads seek by member offset."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from webdataset import tariterators

from kohakumoss_common.errors import DataError

from ..probe import MISSING_REFERENCE
from ..records import RawItem, RawReference, Unit
from .base import Source
from .files import NAME_NOT_UTF8, name_is_utf8, readable_name, stat_signature
from .references import references_of

TRUNCATED_TAR = "truncated_tar"
COMPRESSED_TAR = "compressed_tar"
DEFAULT_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "jxl", "avif", "bmp", "tif", "tiff")
# compressed shards: images are read by seeking to a member's offset, which only a plain tar has
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))


def tar_files(path: Path) -> list[Path]:
    """The shards: `path` itself, or every .tar under it (compressed ones too, which the scan names as drops)."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            f for f in path.rglob("*") if f.name.endswith((".tar", *COMPRESSED_SUFFIXES)) and f.is_file()
        )
        if files:
            return files
    raise DataError(f"{path}: no webdataset .tar shard here")


def compression(tar: Path) -> str:
    """ "" for a plain tar, else the compression its first bytes show (gzip, bzip2, xz, zstd)."""
    with open(tar, "rb") as f:
        head = f.read(6)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), "")


def member_offsets(tar: Path) -> dict[str, tuple[int, int]]:
    """{member name: (data offset, size)} so one image is read with a single seek."""
    out = {}
    with tarfile.open(tar) as tf:
        try:
            for m in tf:
                if m.isfile():
                    out[m.name] = (m.offset_data, m.size)
        except tarfile.TarError:  # a cut tar: the members before the cut stay readable
            pass
    return out


def ends_cleanly(tar: Path) -> bool:
    """A whole tar is a multiple of 512 bytes and ends with two zero blocks."""
    size = tar.stat().st_size
    if size % 512 or size < 1024:
        return False
    with open(tar, "rb") as f:
        f.seek(size - 1024)
        return not any(f.read(1024))


class WebDatasetSource(Source):
    kind = "webdataset"

    def __init__(
        self,
        path: str | Path,
        image_exts: Iterable[str] = DEFAULT_IMAGE_EXTS,
        caption_ext: str = "txt",
        references: str | None = None,
    ):
        super().__init__(path)
        self.image_exts = tuple(e.lstrip(".").lower() for e in image_exts)
        self.caption_ext = caption_ext.lstrip(".")
        # edit training: the field of each sample's .json member naming its reference members (extensions)
        self.references = references or None
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
        packed = compression(tar)
        if packed:
            reason = f"{packed}-compressed tar: images are read by seeking, so shards must be plain .tar (decompress it)"
            yield RawItem(
                unit_id, unit_id, [unit_id, ""], None, None, name=tar.name, fault=(COMPRESSED_TAR, reason)
            )
            return
        yield from self._samples(unit_id, tar)

    def _samples(self, unit_id: str, tar: Path) -> Iterator[RawItem]:
        last: list[str] = []
        errors: list[Exception] = []

        def note(name: str) -> str:
            last[:] = [name]
            return name

        def stop(exn: Exception) -> bool:
            errors.append(exn)
            return False  # end this tar; the samples read so far are kept

        samples = tariterators.tarfile_samples([{"url": str(tar)}], handler=stop, rename_files=note)
        images, captions, matched, found = 0, 0, 0, set()
        try:
            for sample in samples:
                found.update(k for k in sample if not k.startswith("__"))
                item = self._item(unit_id, sample)
                if item is not None and not (errors and self._cut_key(last) == sample["__key__"]):
                    matched += 1
                    images += item.fault is None
                    captions += item.captions is not None
                    yield item
        except Exception as e:  # a fault outside webdataset's handler
            errors.append(e)
        if found and not matched and not errors:
            raise DataError(
                f"{tar}: no sample has an image ending in {list(self.image_exts)} (setting image_exts); the "
                f"samples hold {sorted(found)}: add the images' extension to image_exts"
            )
        if images and self.caption_ext and not captions:
            raise DataError(
                f"{tar}: no sample has a '.{self.caption_ext}' caption (setting caption_ext); the samples hold "
                f"{sorted(found)}: set caption_ext to the captions' extension, or '' to train without captions"
            )
        if errors:
            yield self._cut_item(unit_id, last, errors[0])
        elif not ends_cleanly(tar):  # tarfile reads a cut header as the end of the archive
            after = f"after {self._cut_key(last) or 'the start'}"
            cut = tarfile.ReadError("no end-of-archive blocks: cut in a member's header")
            yield replace(self._cut_item(unit_id, [after], cut), key=f"{unit_id}:{after}")

    def _item(self, unit_id: str, sample: dict[str, Any]) -> RawItem | None:
        ext = next((e for e in self.image_exts if e in sample), None)
        if ext is None:
            return None
        key = sample["__key__"]
        caption = sample.get(self.caption_ext) if self.caption_ext else None
        if not name_is_utf8(key):
            name = readable_name(key)
            reason = f"member name '{name}' is not valid UTF-8: rename it to train it"
            return RawItem(
                f"{unit_id}:{name}",
                unit_id,
                [unit_id, ""],
                None,
                None,
                name=name,
                fault=(NAME_NOT_UTF8, reason),
            )
        item = RawItem(
            key=f"{unit_id}:{key}",
            unit=unit_id,
            locator=[unit_id, f"{key}.{ext}"],
            data=sample[ext],
            captions=[caption] if caption is not None else None,
            name=Path(key).name,
        )
        if self.references:
            self._attach_references(item, unit_id, sample)
        return item

    def _attach_references(self, item: RawItem, unit_id: str, sample: dict[str, Any]) -> None:
        """The members the sample's .json names in its references field (extensions), or a named drop."""
        key, where = sample["__key__"], f"{self._tar(unit_id)}: {sample['__key__']}.json"
        try:
            meta = json.loads(sample["json"]) if "json" in sample else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            item.fault = (
                MISSING_REFERENCE,
                f"{where} is not JSON ({e}): its '{self.references}' cannot be read",
            )
            return
        exts = references_of(meta.get(self.references)) if isinstance(meta, dict) else []
        if not exts:
            item.fault = (MISSING_REFERENCE, f"{where}: no '{self.references}' field (option references)")
            return
        item.references = [
            RawReference([unit_id, f"{key}.{ext}"], sample.get(str(ext)), f"{self._tar(unit_id)}/{key}.{ext}")
            for ext in exts
        ]

    @staticmethod
    def _cut_key(last: list[str]) -> str:
        return tariterators.base_plus_ext(last[0])[0] if last else ""

    def _cut_item(self, unit_id: str, last: list[str], exn: Exception) -> RawItem:
        """The sample the tar breaks in, as a recorded drop (`truncated_tar`)."""
        member = last[0] if last else "<header>"
        message = str(exn.args[0]).split(" @ ", 1)[0] if exn.args else ""
        return RawItem(
            key=f"{unit_id}:{self._cut_key(last) or member}",
            unit=unit_id,
            locator=[unit_id, member],
            data=None,
            captions=None,
            name=Path(member).stem,
            fault=(TRUNCATED_TAR, f"tar breaks in member {member}: {type(exn).__name__}: {message}"),
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
        spec = {**super().spec(), "image_exts": self.image_exts, "caption_ext": self.caption_ext}
        return spec | ({"references": self.references} if self.references else {})
