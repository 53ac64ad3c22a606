"""A key -> tensor cache stored as safetensors shards, one folder per encoder identity.

The folder name is a hash of the identity and every shard records the identity in its metadata;
a shard whose identity differs is ignored, so a cache from another VAE or text encoder is never used.
New entries are buffered and written as a new shard (atomically), so an interrupted run loses at
most one unflushed shard and a rerun skips everything already written.

A shard records each entry's checksum. A shard cut short (its size differs from its header's), one
whose header cannot be read, or an entry whose bytes differ from its checksum is named in the log and
set aside as `<shard>.broken`: its entries become misses, encoded again where an encoder is at hand
(the cache scripts, a trainer encoding misses) and refused by name where none is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from kohakumoss_common.errors import KohakuMossError
from kohakumoss_common.hashing import canonical_json, sha256_json
from kohakumoss_common.io import read_header, save_safetensors
from kohakumoss_common.log import get_logger

IDENTITY_KEY = "kohakumoss.identity"
SUMS_KEY = "kohakumoss.sha256"  # {entry key: first 16 hex digits of the sha256 of its bytes}
SHARD_ITEMS = 512  # entries per shard file (the data scripts' SHARD_ITEMS knob's default; the trainer's)
log = get_logger(__name__)


def entry_sum(tensor: torch.Tensor) -> str:
    """Checksum of one entry's bytes (its dtype's raw layout, whatever the dtype)."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(raw).hexdigest()[:16]


class TensorCache:
    def __init__(self, root: str | Path, identity: dict[str, str], shard_items: int = SHARD_ITEMS):
        self.root = Path(root)
        self.identity = identity
        self.dir = self.root / identity.get("kind", "cache") / sha256_json(identity)[:20]
        self.shard_items = shard_items
        self._index: dict[str, str] | None = None
        self._pending: dict[str, torch.Tensor] = {}
        self._handles: dict[str, Any] = {}
        self._sums: dict[str, dict[str, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}, "_pending": {}}

    def _identity_text(self) -> str:
        return canonical_json(self.identity)

    def refresh(self) -> dict[str, str]:
        """Re-read which keys live in which shard (shards written since are picked up)."""
        index: dict[str, str] = {}
        self._sums: dict[str, dict[str, str]] = {}
        for file in sorted(self.dir.glob("*.safetensors")) if self.dir.is_dir() else []:
            try:  # safetensors refuses a shard cut short or with a garbled header: named, set aside
                entries, metadata = read_header(file)
            except KohakuMossError as e:
                self.set_aside(file.name, str(e))
                continue
            if metadata.get(IDENTITY_KEY) != self._identity_text():
                log.warning("%s: written by another encoder (identity differs), ignored", file)
                continue
            index.update(dict.fromkeys(entries, file.name))
            if SUMS_KEY in metadata:  # shards written before checksums are checked by size only
                self._sums[file.name] = json.loads(metadata[SUMS_KEY])
        self._index = index
        return index

    def set_aside(self, name: str, problem: str) -> None:
        """Rename a broken shard to `<name>.broken` (kept for a look) and forget its entries."""
        file = self.dir / name
        log.warning(
            "%s: broken cache shard (%s); set aside as %s.broken, its entries are encoded again",
            file,
            problem,
            name,
        )
        with contextlib.suppress(FileNotFoundError):  # another process set it aside first
            os.replace(file, file.with_name(name + ".broken"))
        self._handles.pop(name, None)
        if self._index is not None:
            self._index = {k: v for k, v in self._index.items() if v != name}

    @property
    def index(self) -> dict[str, str]:
        return self._index if self._index is not None else self.refresh()

    def __contains__(self, key: str) -> bool:
        return key in self._pending or key in self.index

    def __len__(self) -> int:
        return len(set(self.index) | set(self._pending))

    def get(self, key: str) -> torch.Tensor | None:
        if key in self._pending:
            return self._pending[key]
        name = self.index.get(key)
        if name is None:
            return None
        try:
            if name not in self._handles:
                self._handles[name] = safe_open(str(self.dir / name), framework="pt")
            tensor = self._handles[name].get_tensor(key)
        except Exception as e:  # safetensors raises its own error types for damaged files
            self.set_aside(name, f"cannot read {key!r}: {type(e).__name__}: {e}")
            return None
        want = self._sums.get(name, {}).get(key)
        if want is not None and entry_sum(tensor) != want:
            self.set_aside(name, f"entry {key!r} differs from its checksum")
            return None
        return tensor

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self._pending[key] = tensor.detach().to("cpu").contiguous()
        if len(self._pending) >= self.shard_items:
            self.flush()

    def flush(self) -> Path | None:
        """Write the pending entries as one new shard."""
        if not self._pending:
            return None
        path = self.dir / f"part-{uuid.uuid4().hex[:16]}.safetensors"
        meta = {
            IDENTITY_KEY: self._identity_text(),
            "identity_json": json.dumps(self.identity),
            SUMS_KEY: json.dumps({k: entry_sum(t) for k, t in self._pending.items()}),
        }
        save_safetensors(self._pending, path, meta)
        if self._index is not None:
            self._index.update(dict.fromkeys(self._pending, path.name))
            self._sums[path.name] = json.loads(meta[SUMS_KEY])
        self._pending = {}
        return path
