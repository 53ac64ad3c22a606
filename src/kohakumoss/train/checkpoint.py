"""Checkpoint folders `step_XXXXX/`: written atomically, listed, pruned and resolved ('latest'); kohakumoss.checkpoint reads them.

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

Resume verifies a checkpoint against its meta (`verify_checkpoint`: each file's size and sha256; meta.json,
data.json and the folder name one step): 'latest' falls back to the newest one that verifies, naming the
broken ones, and takes every piece of state from it; a named checkpoint that fails is an error naming the file.
Before writing, the free space is compared with the bytes the checkpoint will take.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

# reading sits below train and export (kohakumoss.checkpoint); re-exported for the trainer's callers
from kohakumoss.checkpoint.read import FORMAT
from kohakumoss.checkpoint.read import Checkpoint as Checkpoint
from kohakumoss.checkpoint.read import load_checkpoint as load_checkpoint
from kohakumoss.checkpoint.rng import capture_rng, save_rng
from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.hashing import sha256_file
from kohakumoss_common.io import (
    atomic_dir,
    atomic_path,
    atomic_write_json,
    disk_full_as_error,
    ensure_free_space,
    restore_set_aside,
    save_safetensors,
)
from kohakumoss_common.log import get_logger

log = get_logger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
# what a crash during a save (atomic_dir's temporary or replaced folder) or a prune leaves behind
_STALE = re.compile(r"^\.step_\d+\.(.+\.tmp|deleting|old)$")
_SLACK = 1 << 20  # json files, headers and file-system overhead beside the tensors' bytes
# a save this large takes seconds to minutes (a full fine-tune's weights and optimizer states): say so first
ANNOUNCE_BYTES = 1 << 30


def step_dirname(step: int) -> str:
    """`step_00001000`: eight digits, so folders sort by step (older 5-digit names still resolve)."""
    return f"step_{step:08d}"


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


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / "meta.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def prune_checkpoints(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints (renamed hidden first, so none is half-deleted)."""
    if keep_last < 1:
        return []
    removed = []
    for _, p in list_checkpoints(root)[:-keep_last]:
        trash = p.with_name(f".{p.name}.deleting")
        p.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(p)
    return removed


def restore_interrupted(root: str | Path) -> list[Path]:
    """A re-saved step's previous copy (`.step_X.old`) put back where a kill between the save's two renames
    left no `step_X`: the complete copy that the save had set aside."""
    root = Path(root)
    if not root.is_dir():
        return []
    restored = []
    for p in sorted(root.iterdir()):
        m = re.match(r"^\.(step_\d+)\.old$", p.name)
        if m and restore_set_aside(root / m.group(1)):
            restored.append(root / m.group(1))
    return restored


def clean_stale(root: str | Path) -> list[Path]:
    """Remove what a crash during a save or a prune left in `root` (`.step_*.tmp`, `.deleting`, `.old`),
    after a set-aside copy with no step folder is restored (`restore_interrupted`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    for restored in restore_interrupted(root):
        log.warning(f"{restored.name} restored: a save of it was interrupted between its renames")
    removed = [p for p in sorted(root.iterdir()) if _STALE.match(p.name)]
    for p in removed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return removed


def set_aside_later(root: str | Path, step: int) -> list[Path]:
    """Rename the checkpoints in `root` past `step` (another timeline, or broken) to `step_X.broken` /
    `step_X.superseded`: kept for inspection, no longer counted by 'latest' or KEEP_LAST."""
    moved = []
    for s, p in list_checkpoints(root):
        if s > step:
            target = p.with_name(f"{p.name}.{'broken' if verify_checkpoint(p) else 'superseded'}")
            if target.exists():
                shutil.rmtree(target)
            p.rename(target)
            moved.append(target)
    return moved


def verify_checkpoint(path: str | Path) -> str | None:
    """Why the checkpoint folder `path` is broken (naming the file), or None when its files match meta.json.

    A checkpoint written before meta recorded its files is checked for its files' presence only.
    """
    path = Path(path)
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as e:
        return f"{meta_file}: unreadable ({e})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return f"{meta_file}: checkpoint format {meta.get('format') if isinstance(meta, dict) else '?'} is not {FORMAT}"
    records = meta.get("files")
    if records is None:
        needed = ["trainable.safetensors", "rng.json", "data.json", "config.json"]
        missing = [n for n in needed if not (path / n).is_file()]
        return f"{path / missing[0]}: missing" if missing else None
    for name, rec in records.items():
        file = path / name
        if not file.is_file():
            return f"{file}: missing"
        size = file.stat().st_size
        if size != rec["size"]:
            return f"{file}: {size} bytes, {rec['size']} written"
        if sha256_file(file) != rec["sha256"]:
            return f"{file}: checksum differs from the one written"
    return position_problem(path, meta)


def position_problem(path: Path, meta: dict) -> str | None:
    """Why the checkpoint's parts name another step than its folder (a folder copied or renamed, a data.json
    of another save), or None: a resume takes the step, the data position and the weights from one save."""
    step, named = meta.get("step"), _STEP_DIR.match(path.name)
    if named and step != int(named.group(1)):
        return f"{path / 'meta.json'}: step {step}, but the folder is {path.name}"
    try:
        position = json.loads((path / "data.json").read_text())
        accum = json.loads((path / "config.json").read_text()).get("GRAD_ACCUM")
    except (OSError, ValueError):  # an older checkpoint's missing part: load_checkpoint names it
        return None
    if not isinstance(position, dict) or position.get("step", step) != step:
        return f"{path / 'data.json'}: the data position of another step than {step} ({position})"
    micro = position.get("micro_step")
    if micro is not None and isinstance(accum, int) and micro != step * accum:
        return f"{path / 'data.json'}: micro-step {micro}, but step {step} x GRAD_ACCUM {accum} is {step * accum}"
    return None


def resolve_checkpoint(root: str | Path, which: str | Path = "latest") -> Path | None:
    """'latest' under `root`: the newest checkpoint that verifies (None when there is none), or a given
    checkpoint folder / checkpoints root, which must verify (CheckpointError naming the broken file)."""
    if str(which) == "latest":
        found = list_checkpoints(root)
        broken = []
        for _, p in reversed(found):
            problem = verify_checkpoint(p)
            if problem is None:
                if broken:
                    log.warning(f"resuming from {p}, the newest checkpoint that verifies")
                return p
            log.warning(f"checkpoint {p.name} is broken, skipped: {problem}")
            broken.append(problem)
        if broken:
            raise CheckpointError(root, f"no checkpoint verifies ({'; '.join(broken)})")
        return None
    path = Path(which)
    if not (path / "meta.json").is_file():
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(path, "not a checkpoint folder and holds no complete step_XXXXX checkpoint")
        path = found[-1][1]
    problem = verify_checkpoint(path)
    if problem is not None:
        raise CheckpointError(path, f"broken checkpoint: {problem}")
    return path
