"""Stable content hashes: files, bytes and JSON-able keys (cache keys, plan digests)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the same object always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj).encode("utf-8"))


def safetensors_hashes(tensors: dict, metadata: dict[str, str] | None = None) -> dict[str, str]:
    """The hashes model managers read from a safetensors file's metadata, for `tensors` as written:
    `sshs_model_hash` (sd-scripts' / the A1111 additional-networks hash: sha256 of the data after the
    header), `sshs_legacy_hash` (its older 8-digit form over 64 KiB at 1 MiB of a file holding the ss_*
    keys) and `modelspec.hash_sha256` (the same data hash, 0x-prefixed as ModelSpec writes it)."""
    from safetensors.torch import save

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    kept = {k: v for k, v in (metadata or {}).items() if k.startswith("ss_")}  # sd-scripts hashes these only
    blob = save(cpu, kept or None)
    # the hash is defined over the bytes after the header (sd-scripts' `addnet_hash_safetensors`), so only
    # the header's length is read here; safetensors has no call that says where its data starts
    start = 8 + int.from_bytes(blob[:8], "little")
    data = hashlib.sha256(memoryview(blob)[start:]).hexdigest()
    legacy = hashlib.sha256(memoryview(blob)[0x100000 : 0x100000 + 0x10000]).hexdigest()[:8]
    return {"sshs_model_hash": data, "sshs_legacy_hash": legacy, "modelspec.hash_sha256": f"0x{data}"}


def safetensors_data_sha256(path: str | Path) -> str:
    """sha256 of a safetensors file's tensor data (the bytes after its header), as `sshs_model_hash`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little"))  # the data's start: no safetensors call says it
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
