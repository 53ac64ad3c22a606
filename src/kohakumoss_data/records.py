"""The plain records passed between sources, the catalog and the planner (all JSON-able)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK = "ok"


@dataclass(frozen=True)
class Unit:
    """One thing a source can tell has changed: a file, a tar, a parquet file, a jsonl line."""

    id: str
    signature: str


@dataclass
class RawReference:
    """One reference image of an item (edit training), as a source yields it while scanning."""

    locator: Any  # JSON-able; handed back to Source.read_reference
    data: Any  # bytes, or None when the file named for it does not exist
    name: str  # the file or member, as a report names it
    fault: str = ""  # why it cannot be read (a permission, a FIFO): a named drop of its item


@dataclass
class RawItem:
    """One image as a source yields it while scanning: its bytes (or pixels) and raw caption bytes."""

    key: str
    unit: str  # the Unit.id it came from
    locator: Any  # JSON-able; handed back to Source.read
    data: Any  # bytes, or a PIL image for pre-decoded sources
    captions: list[bytes] | None  # None: no caption found
    repeats: int = 1
    name: str = ""  # file stem, for the "filename" caption policy
    extra: dict[str, Any] = field(default_factory=dict)
    probed: dict[str, Any] | None = None  # width/height/hash already known (pre-decoded shards)
    fault: tuple[str, str] | None = None  # (status, reason): found unusable before decoding
    references: list[RawReference] = field(default_factory=list)  # in order (a dataset's `references`)


@dataclass
class CatalogItem:
    """One scanned image: size after EXIF rotation, content hash, captions, status and reason."""

    key: str
    unit: str
    locator: Any
    width: int = 0
    height: int = 0
    hash: str = ""
    captions: list[str] = field(default_factory=list)
    caption_status: str = OK  # ok | missing | not_utf8
    repeats: int = 1
    name: str = ""
    status: str = OK
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # reference images in order, each {"locator", "name", "width", "height", "hash"} (edit training)
    references: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CatalogItem:
        return cls(**obj)
