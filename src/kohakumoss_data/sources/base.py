"""The one interface every source implements: list units, expand a changed unit, read one image."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from ..records import RawItem, Unit


class Source(ABC):
    """A dataset on disk. Sources hold only paths and knobs, so they pickle into loader workers."""

    kind: str = ""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @abstractmethod
    def units(self) -> Iterator[Unit]:
        """Everything that can change independently, with a cheap signature (sizes, mtimes)."""

    @abstractmethod
    def expand(self, unit_id: str) -> Iterator[RawItem]:
        """Read one unit in full: its images' bytes and caption bytes."""

    def expand_units(self, unit_ids: list[str]) -> Iterator[RawItem]:
        """Expand many units; sources that read one big file override this to read it once."""
        for unit_id in unit_ids:
            yield from self.expand(unit_id)

    @abstractmethod
    def read(self, locator: Any) -> bytes | Image.Image:
        """The bytes (or pixels) of one image, as located by the scan."""

    def read_reference(self, locator: Any) -> bytes | Image.Image:
        """The bytes of one reference image, as located by the scan (`CatalogItem.references`)."""
        return self.read(locator)

    def catalog_home(self) -> Path | None:
        """The folder that holds this dataset's catalog cache by default (None: the user cache)."""
        return self.path if self.path.is_dir() else self.path.parent

    def spec(self) -> dict[str, Any]:
        """Everything that identifies this source's content (part of the catalog cache key)."""
        return {"kind": self.kind, "path": str(self.path.resolve())}
