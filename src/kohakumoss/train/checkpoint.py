"""Checkpoint folders `step_XXXXX/`: written atomically, listed, pruned, resolved ('latest') and loaded.

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
      meta.json              step, format, files; written last
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import atomic_dir, atomic_path, atomic_write_json, load_tensors, save_safetensors

from .rng import capture_rng, load_rng, save_rng

FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dirname(step: int) -> str:
    """`step_00001000`: eight digits, so folders sort by step (older 5-digit names still resolve)."""
    return f"step_{step:08d}"


@dataclass
class Checkpoint:
    path: Path
    step: int
    trainable: dict[str, torch.Tensor]
    optimizer: dict | None
    ema: dict | None
    rng: dict
    data_position: dict
    config: dict
    metadata: dict = field(default_factory=dict)


def save_checkpoint(
    root: str | Path,
    step: int,
    trainable: dict[str, torch.Tensor],
    optimizer_state: dict | None = None,
    ema_state: dict | None = None,
    generators: dict[str, torch.Generator] | None = None,
    data_position: dict | None = None,
    config: dict | None = None,
    metadata: dict | None = None,
    keep_last: int | None = None,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `root/step_XXXXXXXX/` atomically and return its path; `write_extra(tmp_dir)` adds files (exports)."""
    root = Path(root)
    path = root / step_dirname(step)
    with atomic_dir(path) as tmp:
        save_safetensors(trainable, tmp / "trainable.safetensors")
        if optimizer_state is not None:
            with atomic_path(tmp / "optimizer.pt") as f:
                torch.save(optimizer_state, f)
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
            **(metadata or {}),
        }
        atomic_write_json(tmp / "meta.json", meta)
    if keep_last is not None:
        prune_checkpoints(root, keep_last)
    return path


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


def resolve_checkpoint(root: str | Path, which: str | Path = "latest") -> Path | None:
    """'latest' under `root` (None when there is none), or a given checkpoint folder / checkpoints root."""
    if str(which) == "latest":
        found = list_checkpoints(root)
        return found[-1][1] if found else None
    path = Path(which)
    if (path / "meta.json").is_file():
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(path, "not a checkpoint folder and holds no complete step_XXXXX checkpoint")
    return found[-1][1]


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read every part of a complete checkpoint folder (tensors on the CPU)."""
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise CheckpointError(path, "incomplete checkpoint (no meta.json)")
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(path, f"checkpoint format {meta.get('format')} is not {FORMAT}")
    optimizer = None
    if meta.get("has_optimizer"):
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    ema = None
    if meta.get("ema") is not None:
        ema = {**meta["ema"], "shadow": load_tensors(path / "ema.safetensors")}
    return Checkpoint(
        path=path,
        step=int(meta["step"]),
        trainable=load_tensors(path / "trainable.safetensors"),
        optimizer=optimizer,
        ema=ema,
        rng=load_rng(path),
        data_position=json.loads((path / "data.json").read_text()),
        config=json.loads((path / "config.json").read_text()),
        metadata=meta,
    )
