"""jsonl manifests: one JSON object per line with an image path (relative to the manifest) and caption(s)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import DataError
from kohakumoss_common.hashing import sha256_bytes

from ..probe import MISSING_REFERENCE
from ..records import RawItem, Unit
from .base import Source
from .files import NOT_A_FILE, UNREADABLE, entry_fault, fault_reason, read_regular, stat_signature
from .references import read_reference_file, references_of


def caption_blobs(value: Any) -> list[bytes] | None:
    """A caption field (string, list of strings, or absent) as raw caption bytes."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    return [str(v).encode("utf-8") for v in values]


class JsonlSource(Source):
    kind = "jsonl"

    def __init__(
        self,
        path: str | Path,
        image_key: str = "image",
        caption_key: str = "caption",
        image_root: str | Path | None = None,
        references: str | None = None,
    ):
        super().__init__(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: jsonl manifest does not exist")
        self.image_key = image_key
        self.caption_key = caption_key
        self.references = references or None  # edit training: the key of each line's reference path(s)
        self.image_root = Path(image_root) if image_root else self.path.parent

    def _records(self) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise DataError(f"{self.path}:{lineno}: not a JSON object ({e})") from e
                if not isinstance(record, dict):
                    raise DataError(f"{self.path}:{lineno}: not a JSON object")
                if self.image_key not in record:
                    raise DataError(
                        f"{self.path}:{lineno}: no '{self.image_key}' field (knob image_key); "
                        f"the line's keys are {sorted(record)}"
                    )
                yield lineno, line, record

    def _image_path(self, record: dict[str, Any]) -> Path:
        rel = str(record[self.image_key])
        if "://" in rel:
            raise DataError(f"{self.path}: '{rel}' is a URL; jsonl images must be local relative paths")
        return self.image_root / rel

    def _reference_paths(self, record: dict[str, Any]) -> list[tuple[str, Path]]:
        """(as written, the file) of each reference of a line, relative to image_root."""
        if self.references is None:
            return []
        return [(str(v), self.image_root / str(v)) for v in references_of(record.get(self.references))]

    def units(self) -> Iterator[Unit]:
        """One unit per line; a manifest in which no line has the caption key is refused once listed."""
        keys: set[str] = set()
        captioned = False
        for lineno, line, record in self._records():
            keys.update(record)
            captioned = captioned or self.caption_key in record
            image = self._image_path(record)
            sig = stat_signature(image) if image.is_file() else "missing"
            for _, ref in self._reference_paths(record):  # an edited reference re-reads the line
                sig += f"|{stat_signature(ref) if ref.is_file() else 'missing'}"
            yield Unit(f"{lineno}:{record[self.image_key]}", f"{sha256_bytes(line)}|{sig}")
        if keys and self.caption_key and not captioned:
            raise DataError(
                f"{self.path}: no line has the caption key '{self.caption_key}' (setting caption_key); the keys "
                f"found are {sorted(keys)}: set caption_key to the captions' key, or '' to train without captions"
            )

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        yield from self.expand_units([unit_id])

    def expand_units(self, unit_ids: list[str]) -> Iterator[RawItem]:
        wanted = {int(u.split(":", 1)[0]): u for u in unit_ids}
        for lineno, _, record in self._records():
            if lineno not in wanted:
                continue
            image = self._image_path(record)
            own = (self.image_key, self.caption_key, self.references)
            extra = {k: v for k, v in record.items() if k not in own}
            rel = str(record[self.image_key])
            fault = None
            try:
                data = image.read_bytes() if image.is_file() else None
            except OSError as e:  # listed but unreadable (permissions, vanished)
                data, fault = None, (UNREADABLE, f"{image}: {type(e).__name__}: {e}")
            if data is None and fault is None and entry_fault(image) == NOT_A_FILE:  # a FIFO: never opened
                fault = (NOT_A_FILE, f"{image}: {fault_reason(image, NOT_A_FILE)}")
            refs = self._reference_paths(record)
            if self.references is not None and not refs and fault is None:
                fault = (
                    MISSING_REFERENCE,
                    f"{self.path}:{lineno}: no '{self.references}' field (option references)",
                )
            yield RawItem(
                key=wanted[lineno],
                unit=wanted[lineno],
                locator=rel,
                data=data,
                captions=caption_blobs(record.get(self.caption_key) if self.caption_key else None),
                name=Path(rel).stem,
                extra=extra,
                fault=fault,
                references=[read_reference_file(p, rel, str(p)) for rel, p in refs],
            )

    def read(self, locator: str) -> bytes:
        return read_regular(self.image_root / locator)

    def read_reference(self, locator: str) -> bytes:
        return read_regular(self.image_root / locator)

    def spec(self) -> dict:
        return {
            **super().spec(),
            "image_key": self.image_key,
            "caption_key": self.caption_key,
            "image_root": str(self.image_root.resolve()),
            **({"references": self.references} if self.references else {}),
        }
