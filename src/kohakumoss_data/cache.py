"""A key -> tensor cache stored as safetensors shards, one folder per encoder identity.

The folder name is a hash of the identity and every shard records the identity in its metadata;
a shard whose identity differs is ignored, so a cache from another VAE or text encoder is never used.
New entries are buffered and written as a new shard (atomically), so an interrupted run loses at
most one unflushed shard and a rerun skips everything already written.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from kohakumoss_common.hashing import canonical_json, sha256_json
from kohakumoss_common.io import read_header, save_safetensors
from kohakumoss_common.log import get_logger

IDENTITY_KEY = "kohakumoss.identity"
log = get_logger(__name__)


class TensorCache:
    def __init__(self, root: str | Path, identity: dict[str, str], shard_items: int = 512):
        self.root = Path(root)
        self.identity = identity
        self.dir = self.root / identity.get("kind", "cache") / sha256_json(identity)[:20]
        self.shard_items = shard_items
        self._index: dict[str, str] | None = None
        self._pending: dict[str, torch.Tensor] = {}
        self._handles: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}, "_pending": {}}

    def _identity_text(self) -> str:
        return canonical_json(self.identity)

    def refresh(self) -> dict[str, str]:
        """Re-read which keys live in which shard (shards written since are picked up)."""
        index: dict[str, str] = {}
        for file in sorted(self.dir.glob("*.safetensors")) if self.dir.is_dir() else []:
            entries, metadata = read_header(file)
            if metadata.get(IDENTITY_KEY) != self._identity_text():
                log.warning("%s: written by another encoder (identity differs), ignored", file)
                continue
            index.update(dict.fromkeys(entries, file.name))
        self._index = index
        return index

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
        if name not in self._handles:
            self._handles[name] = safe_open(str(self.dir / name), framework="pt")
        return self._handles[name].get_tensor(key)

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self._pending[key] = tensor.detach().to("cpu").contiguous()
        if len(self._pending) >= self.shard_items:
            self.flush()

    def flush(self) -> Path | None:
        """Write the pending entries as one new shard."""
        if not self._pending:
            return None
        path = self.dir / f"part-{uuid.uuid4().hex[:16]}.safetensors"
        meta = {IDENTITY_KEY: self._identity_text(), "identity_json": json.dumps(self.identity)}
        save_safetensors(self._pending, path, meta)
        if self._index is not None:
            self._index.update(dict.fromkeys(self._pending, path.name))
        self._pending = {}
        return path
