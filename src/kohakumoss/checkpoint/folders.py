"""Checkpoint folders under a run's `checkpoints/`: listed, pruned, verified against their meta.json and
resolved ('latest'); `write.py` writes one, `read.py` reads one back.

Resume verifies a checkpoint against its meta (`verify_checkpoint`: each file's size and sha256; meta.json,
data.json and the folder name one step): 'latest' falls back to the newest one that verifies, naming the
broken ones, and takes every piece of state from it; a named checkpoint that fails is an error naming the file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.hashing import sha256_file
from kohakumoss_common.io import restore_set_aside
from kohakumoss_common.log import get_logger

from .read import FORMAT

log = get_logger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
# what a crash during a save (atomic_dir's temporary or replaced folder) or a prune leaves behind
_STALE = re.compile(r"^\.step_\d+\.(.+\.tmp|deleting|old)$")


def step_dirname(step: int) -> str:
    """`step_00001000`: eight digits, so folders sort by step (older 5-digit names still resolve)."""
    return f"step_{step:08d}"


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
