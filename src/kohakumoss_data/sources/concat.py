"""Several datasets trained as one (kohya's multiple subsets): keys and units are prefixed by position."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from kohakumoss_common.errors import ConfigError

from ..records import RawItem, Unit
from .base import Source


def split_prefixed(value: str) -> tuple[int, str]:
    """'2/3_cat/a.jpg' -> (2, '3_cat/a.jpg')."""
    head, _, rest = value.partition("/")
    return int(head), rest


class ConcatSource(Source):
    kind = "concat"

    def __init__(self, sources: list[Source]):
        if not sources:
            raise ConfigError("dataset", "an empty list of datasets")
        super().__init__(Path(sources[0].path))
        self.sources = sources

    def catalog_home(self) -> Path | None:
        return None  # no single dataset folder owns the combined catalog

    def units(self) -> Iterator[Unit]:
        for i, source in enumerate(self.sources):
            for unit in source.units():
                yield Unit(f"{i}/{unit.id}", unit.signature)

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        yield from self.expand_units([unit_id])

    def expand_units(self, unit_ids: list[str]) -> Iterator[RawItem]:
        by_source: dict[int, list[str]] = defaultdict(list)
        for unit_id in unit_ids:
            i, rest = split_prefixed(unit_id)
            by_source[i].append(rest)
        for i in sorted(by_source):
            for raw in self.sources[i].expand_units(by_source[i]):
                raw.key, raw.unit, raw.locator = f"{i}/{raw.key}", f"{i}/{raw.unit}", [i, raw.locator]
                for ref in raw.references:
                    ref.locator = [i, ref.locator]
                yield raw

    def read(self, locator: list) -> bytes | Image.Image:
        i, inner = locator
        return self.sources[i].read(inner)

    def read_reference(self, locator: list) -> bytes | Image.Image:
        i, inner = locator
        return self.sources[i].read_reference(inner)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "sources": [s.spec() for s in self.sources]}
