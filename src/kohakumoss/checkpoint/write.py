"""Writing a checkpoint folder `step_XXXXXXXX/` atomically (`folders.py` lists, prunes, verifies and
resolves them; `read.py` reads one back).

A folder is built under a hidden temporary name and renamed into place only when every file is
written (`kohakumoss_common.io.atomic_dir`), so a crash or kill during a save leaves the previous
checkpoint as the latest one. Only `step_<digits>` folders holding `meta.json` count as checkpoints.

    step_00000010/
      trainable.safetensors  trainable weights (adapter network or full model)
      optimizer.pt           optimizer state_dict (torch.save; loaded with weights_only=True)
      ema.safetensors        EMA shadows (+ counters in meta.json)
      rng.json, rng.safetensors  python / numpy / torch / cuda / named generator states
      data.json              the data plan position
      config.json            the run's config snapshot
      meta.json              step, format, each file's size and sha256; written last
      sharded/               DISTRIBUTED='fsdp' in place of trainable.safetensors and optimizer.pt: the
                             trainable weights and optimizer states as torch.distributed.checkpoint
                             shards, written by every rank into the temporary folder (any world size reads them)

Before writing, the free space is compared with the bytes the checkpoint will take.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from kohakumoss_common.hashing import sha256_file
from kohakumoss_common.io import (
    atomic_dir,
    atomic_path,
    atomic_write_json,
    disk_full_as_error,
    ensure_free_space,
    save_safetensors,
)
from kohakumoss_common.log import get_logger

from .folders import prune_checkpoints, step_dirname
from .read import FORMAT
from .rng import capture_rng, save_rng

log = get_logger(__name__)

_SLACK = 1 << 20  # json files, headers and file-system overhead beside the tensors' bytes
# a save this large takes seconds to minutes (a full fine-tune's weights and optimizer states): say so first
ANNOUNCE_BYTES = 1 << 30


def tensor_bytes(obj: object) -> int:
    """Bytes of every tensor inside `obj` (nested dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def file_records(folder: Path) -> dict[str, dict]:
    """{relative path: {size, sha256}} of every file under `folder`."""
    return {
        f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def save_checkpoint(
    root: str | Path,
    step: int,
    trainable: dict[str, torch.Tensor] | None,
    optimizer_state: dict | None = None,
    ema_state: dict | None = None,
    generators: dict[str, torch.Generator] | None = None,
    data_position: dict | None = None,
    config: dict | None = None,
    metadata: dict | None = None,
    keep_last: int | None = None,
    write_extra: Callable[[Path], None] | None = None,
    extra_bytes: int = 0,
    write_sharded: Callable[[Path], None] | None = None,
) -> Path:
    """Write `root/step_XXXXXXXX/` atomically and return its path; `write_extra(tmp_dir)` adds files (exports).
    `write_sharded(tmp_dir)` (FSDP2, with `trainable` None) has every rank write `sharded/` first; count its
    bytes in `extra_bytes`.

    Refused (DiskSpaceError: path, needed, free) when the tensors plus `extra_bytes` (the extra files'
    estimate) do not fit; a disk that fills mid-write raises the same error, its temporary folder removed.
    """
    root = Path(root)
    path = root / step_dirname(step)
    needed = tensor_bytes([trainable, optimizer_state, ema_state]) + extra_bytes + _SLACK
    ensure_free_space(path, needed)
    announce, t0 = needed >= ANNOUNCE_BYTES, time.perf_counter()
    if announce:
        log.info(f"writing {path} (up to {needed / 2**30:.1f} GiB: weights, optimizer states, exports)")
    with disk_full_as_error(path, needed), atomic_dir(path) as tmp:
        _write_parts(
            tmp,
            step,
            trainable,
            optimizer_state,
            ema_state,
            generators,
            data_position,
            config,
            metadata,
            write_extra,
            write_sharded,
        )
    if announce:
        log.info(f"{path.name} written in {time.perf_counter() - t0:.0f} s")
    if keep_last is not None:
        prune_checkpoints(root, keep_last)
    return path


def _write_parts(
    tmp: Path,
    step: int,
    trainable: dict[str, torch.Tensor],
    optimizer_state: dict | None,
    ema_state: dict | None,
    generators: dict[str, torch.Generator] | None,
    data_position: dict | None,
    config: dict | None,
    metadata: dict | None,
    write_extra: Callable[[Path], None] | None,
    write_sharded: Callable[[Path], None] | None = None,
) -> None:
    """Every file of a checkpoint into the temporary folder `tmp`, meta.json (with the files' records) last."""
    if (trainable is None) == (write_sharded is None):
        raise ValueError("a checkpoint holds either trainable weights or a sharded state")
    if write_sharded is not None:
        write_sharded(tmp)
    else:
        save_safetensors(trainable, tmp / "trainable.safetensors")
    if optimizer_state is not None:
        with atomic_path(tmp / "optimizer.pt") as f, open(f, "wb") as fh:
            torch.save(optimizer_state, fh)  # a file object: a full disk raises OSError(ENOSPC)
    ema_meta = None
    if ema_state is not None:
        save_safetensors(ema_state["shadow"], tmp / "ema.safetensors")
        ema_meta = {k: v for k, v in ema_state.items() if k != "shadow"}
    save_rng(capture_rng(generators), tmp)
    atomic_write_json(tmp / "data.json", data_position or {})
    atomic_write_json(tmp / "config.json", config or {})
    if write_extra is not None:
        write_extra(tmp)
    meta = {
        "format": FORMAT,
        "step": step,
        "time": time.time(),
        "ema": ema_meta,
        "has_optimizer": optimizer_state is not None,
        "sharded": write_sharded is not None,
        **(metadata or {}),
        "files": file_records(tmp),
    }
    atomic_write_json(tmp / "meta.json", meta)
