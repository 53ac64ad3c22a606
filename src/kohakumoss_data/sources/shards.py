"""The project's own shard format: pre-decoded, pre-sized RGB images in safetensors files plus metadata.

A folder of `shard-NNNNN.safetensors`; each holds uint8 [H,W,3] tensors named by position and a
`kohakumoss.items` metadata entry (JSON list: key, tensor, width, height, hash, captions, repeats, name).
Scanning reads only headers; reading an image is one memory-mapped tensor read, with no decoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open

from kohakumoss_common.errors import CheckpointError, DataError
from kohakumoss_common.hashing import sha256_bytes
from kohakumoss_common.io import read_header, save_safetensors

from ..records import RawItem, Unit
from .base import Source
from .files import stat_signature

FORMAT = "kohakumoss-shard-v1"
ITEMS_KEY = "kohakumoss.items"
BROKEN_SHARD = "broken_shard"
ITEMS_PER_SHARD = 256  # images per shard file (convert_shards' ITEMS_PER_SHARD knob's default)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def read_shard_items(file: Path) -> list[dict[str, Any]]:
    _, metadata = read_header(file)
    if metadata.get("format") != FORMAT:
        raise DataError(f"{file}: not a {FORMAT} shard (metadata format={metadata.get('format')!r})")
    return json.loads(metadata[ITEMS_KEY])


class ShardWriter:
    """Collect images and write a shard every `items_per_shard` images (atomically)."""

    def __init__(self, out_dir: str | Path, items_per_shard: int = ITEMS_PER_SHARD):
        self.out_dir = Path(out_dir)
        self.items_per_shard = items_per_shard
        self._tensors: dict[str, torch.Tensor] = {}
        self._items: list[dict[str, Any]] = []
        self._index = 0
        self.written: list[Path] = []

    def add(
        self, key: str, image: Image.Image, captions: list[str], repeats: int = 1, name: str = ""
    ) -> None:
        arr = np.asarray(image.convert("RGB"), dtype=np.uint8)
        tensor_name = str(len(self._items))
        self._tensors[tensor_name] = torch.from_numpy(arr.copy())
        self._items.append(
            {
                "key": key,
                "tensor": tensor_name,
                "width": arr.shape[1],
                "height": arr.shape[0],
                "hash": sha256_bytes(arr.tobytes()),
                "captions": captions,
                "repeats": repeats,
                "name": name,
            }
        )
        if len(self._items) >= self.items_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._items:
            return
        path = self.out_dir / shard_name(self._index)
        meta = {"format": FORMAT, ITEMS_KEY: json.dumps(self._items, ensure_ascii=False)}
        save_safetensors(self._tensors, path, meta)
        self.written.append(path)
        self._index += 1
        self._tensors, self._items = {}, []

    def close(self) -> list[Path]:
        self.flush()
        return self.written


class ShardSource(Source):
    kind = "shards"

    def __init__(self, path: str | Path):
        super().__init__(path)
        self._files = sorted(self.path.glob("shard-*.safetensors")) if self.path.is_dir() else []
        if not self._files:
            raise DataError(
                f"{self.path}: no shard-*.safetensors files (write them with scripts/data/convert_shards.py)"
            )

    def units(self) -> Iterator[Unit]:
        for file in self._files:
            yield Unit(file.name, stat_signature(file))

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        try:
            items = read_shard_items(self.path / unit_id)
        except (CheckpointError, DataError, OSError, ValueError, KeyError) as e:  # cut, garbled, not a shard
            reason = f"shard cannot be read ({type(e).__name__}: {e})"
            yield RawItem(
                unit_id, unit_id, [unit_id, ""], None, None, name=unit_id, fault=(BROKEN_SHARD, reason)
            )
            return
        for item in items:
            yield RawItem(
                key=f"{unit_id}:{item['key']}",
                unit=unit_id,
                locator=[unit_id, item["tensor"]],
                data=None,
                captions=[c.encode("utf-8") for c in item["captions"]] or None,
                repeats=int(item.get("repeats", 1)),
                name=item.get("name", ""),
                probed={"width": item["width"], "height": item["height"], "hash": item["hash"]},
            )

    def read(self, locator: list) -> Image.Image:
        unit, tensor = locator
        with safe_open(str(self.path / unit), framework="pt") as f:
            return Image.fromarray(f.get_tensor(tensor).numpy())
