"""Content identities of weight and tokenizer files, cheap enough for 20 GB checkpoints.

A file up to `FULL_HASH_BYTES` is hashed whole; a larger one by its size, its safetensors header and
`SAMPLES` evenly spaced 64 KiB windows, so a fine-tuned checkpoint gets a new identity without
reading every byte (an edit confined to unsampled bytes of a huge file would go unnoticed).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from kohakumoss_common.hashing import sha256_file, sha256_json

FULL_HASH_BYTES = 512 << 20
SAMPLES = 64
WINDOW = 64 << 10


def _sampled_hash(path: Path, size: int) -> str:
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        # the header's raw bytes are hashed, not parsed (safe_open gives them parsed only; a re-serialized
        # header would change every cache key already written)
        header_len = int.from_bytes(f.read(8), "little")
        digest.update(f.read(min(header_len, 100 << 20)))
        step = max(1, (size - WINDOW) // SAMPLES)
        for i in range(SAMPLES):
            f.seek(min(i * step, max(0, size - WINDOW)))
            digest.update(f.read(WINDOW))
    return digest.hexdigest()


def file_identity(path: str | Path) -> str:
    """sha256 of the file, or of its header and sampled windows when it is large."""
    path = Path(path)
    size = path.stat().st_size
    return sha256_file(path) if size <= FULL_HASH_BYTES else _sampled_hash(path, size)


def files_identity(paths: list[Path]) -> str:
    """One identity for a set of files, by content only (not by name or location)."""
    return sha256_json(sorted(file_identity(p) for p in paths))


def module_identity(module: torch.nn.Module) -> str:
    """sha256 of a module's state (names, dtypes, shapes, bytes): for models not loaded from files."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        t = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
