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
