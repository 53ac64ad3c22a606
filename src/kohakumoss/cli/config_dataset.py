"""Guess a dataset's source kind from its path and check that it opens and holds something."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import KohakuMossError

from .config_layers import source_kinds


def guess_source(path: str | Path) -> str:
    """jsonl / parquet files by suffix; a folder of tars, parquet or shards by content; `N_name/` folders
    mean kohya; anything else is a plain folder."""
    p = Path(path)
    if p.is_file():
        return {".jsonl": "jsonl", ".parquet": "parquet", ".tar": "webdataset"}.get(
            p.suffix.lower(), "folder"
        )
    if not p.is_dir():
        return "kohya"
    names = [c.name for c in itertools.islice(p.iterdir(), 2000)]
    if any(n.endswith(".tar") for n in names):
        return "webdataset"
    if any(n.endswith(".parquet") for n in names):
        return "parquet"
    if any(n.endswith(".jsonl") for n in names):
        return "jsonl"
    if any(n.startswith("shard") and n.endswith(".safetensors") for n in names):
        return "shards"
    if any(re.match(r"^\d+_.", n) and (p / n).is_dir() for n in names):
        return "kohya"
    return "folder"


FOLDER_KINDS = ("kohya", "folder")  # their `references` is a folder; the other kinds' a field name


def dataset_spec(path: str | Path, source: str, references: str = "") -> dict[str, Any]:
    """The DATASET entry; references (edit training): a folder for kohya / folder sources, else the
    field of each item that names its references (docs/guides/data.md section 5)."""
    spec: dict[str, Any] = {"kind": source, "path": str(Path(path).expanduser().resolve())}
    if references:
        folder = source in FOLDER_KINDS
        spec["references"] = str(Path(references).expanduser().resolve()) if folder else references
    return spec


def check_dataset(spec: Any) -> str | None:
    """None when the source opens and lists at least one unit, else the problem."""
    from kohakumoss_data.sources import make_source

    if isinstance(spec, dict) and spec.get("kind") not in source_kinds():
        return f"kind {spec.get('kind')!r} is not one of {list(source_kinds())}"
    if isinstance(spec, dict) and "path" in spec and not Path(str(spec["path"])).exists():
        return f"path '{spec['path']}' does not exist"
    try:
        source = make_source(spec)
        if next(iter(source.units()), None) is None:
            return f"no images found in {spec.get('path') if isinstance(spec, dict) else spec}"
    except (KohakuMossError, OSError, ValueError, TypeError) as e:
        return f"cannot open the dataset: {e}"
    return None


def dataset_captions(spec: Any, n: int = 2, look_at: int = 200) -> list[str]:
    """The first `n` distinct non-empty captions of the dataset (first line of each, in the source's
    order, among its first `look_at` items): sample prompts in the style being trained. [] when none.
    An edit dataset's captions come with their item's references as `--ri` flags (those that are files:
    the sampler opens them by path), items whose references are missing left out."""
    from kohakumoss_data.sources import make_source

    out: list[str] = []
    try:
        source = make_source(spec)
        items = (item for unit in source.units() for item in source.expand(unit.id))
        for item in itertools.islice(items, look_at):
            raw = (item.captions or [b""])[0]
            text = (
                raw.decode("utf-8", errors="replace").strip() if isinstance(raw, bytes) else str(raw).strip()
            )
            line = text.splitlines()[0].strip() if text else ""
            if item.fault:
                continue  # a missing or unreadable reference: the scan drops it
            refs = [str(r.locator) for r in item.references if isinstance(r.locator, str)]
            if line and refs and all(Path(r).is_file() for r in refs):
                line += "".join(f" --ri {r}" for r in refs)
            if line and line not in out:
                out.append(line)
            if len(out) == n:
                break
    except (KohakuMossError, OSError, ValueError, TypeError):
        return out  # check_dataset names what is wrong with the dataset
    return out
