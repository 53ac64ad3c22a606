"""Where things live: the user cache (tuning tables, catalogs) and the runs folder."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$KOHAKUMOSS_CACHE, else $XDG_CACHE_HOME/kohakumoss, else ~/.cache/kohakumoss (%LOCALAPPDATA% on Windows)."""
    if env := os.environ.get("KOHAKUMOSS_CACHE"):
        return Path(env)
    if os.name == "nt" and (local := os.environ.get("LOCALAPPDATA")):
        return Path(local) / "kohakumoss"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kohakumoss"


def runs_dir(root: str | Path = "runs") -> Path:
    """The folder that holds every run: runs/moss/<RUN_NAME>/ lives under it."""
    return Path(os.environ.get("KOHAKUMOSS_RUNS", str(root)))


def folder_problem(path: str | Path) -> str | None:
    """Why `path` cannot be (or become) a folder, naming it: a part of it is a file, or a name in it is
    longer than its filesystem allows (PC_NAME_MAX). None when it can."""
    path = Path(path).absolute()
    existing = path
    # a file in the middle makes exists() False; a name too long makes it raise (ENAMETOOLONG)
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # Windows: no pathconf; NTFS names stop at 255
        name_max = 255
    for part in path.relative_to(existing).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            return f"the name {part[:24]}... is {size} bytes long; the filesystem of {existing} allows {name_max}"
    return None
