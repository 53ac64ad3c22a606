"""Convert any source into the project's shard format: decoded once, shrunk to an area budget."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from kohakumoss_common.errors import DataError

from ..catalog import Catalog
from ..decode import decode_rgb
from .base import Source
from .shards import ITEMS_PER_SHARD, ShardWriter


def presize(image: Image.Image, max_area: int | None) -> Image.Image:
    """Shrink (never enlarge) to at most `max_area` pixels at the same aspect."""
    if not max_area or image.width * image.height <= max_area:
        return image
    scale = math.sqrt(max_area / (image.width * image.height))
    size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


def convert_items(
    source: Source, catalog: Catalog, max_area: int | None
) -> Iterator[tuple[str, Image.Image, list[str], int, str]]:
    for item in catalog.usable:
        yield (
            item.key,
            presize(decode_rgb(source.read(item.locator)), max_area),
            item.captions,
            item.repeats,
            item.name,
        )


def convert_to_shards(
    source: Source,
    catalog: Catalog,
    out_dir: str | Path,
    max_area: int | None = None,
    items_per_shard: int = ITEMS_PER_SHARD,
) -> list[Path]:
    """Write every usable item of `catalog` as shards under `out_dir`; returns the shard paths."""
    if any(it.references for it in catalog.usable):  # the shard format holds no reference images
        raise DataError(
            f"{source.path}: the dataset has reference images (option references), which shards do not hold: "
            "train it from its own files"
        )
    writer = ShardWriter(out_dir, items_per_shard)
    for key, image, captions, repeats, name in convert_items(source, catalog, max_area):
        writer.add(key, image, captions, repeats, name)
    return writer.close()
