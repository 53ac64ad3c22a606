"""Knob rules that both the schema (config/train.py, checked before any work starts) and the trainer apply:
the LR schedules, what a run folder may be named, which trackers exist. Which knobs a resumed run may
change is each knob's `resume=` rule (config/train.py derives RESUME_FIXED / RESUME_SAFE from them).

They live below the trainer so that the typed config can check them without importing `kohakumoss.train`
(the trainer imports the config).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# LR_SCHEDULE names (kohya's / diffusers' spellings; train/schedule.py draws them through transformers)
SCHEDULES = (
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "rex",
)
# schedules whose LR at a step does not depend on STEPS: raising STEPS (or EPOCHS) on resume is exact
FLAT_SCHEDULES = ("constant", "constant_with_warmup")


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run folder's name (it must stay under RUNS_DIR), or None."""
    if not name or name in (".", ".."):
        return f"{name!r} is not a folder name"
    if "/" in name or "\\" in name or Path(name).is_absolute():
        return f"{name!r} is a path: RUN_NAME is a plain folder name under RUNS_DIR"
    return None


LOGGERS = ("tensorboard", "wandb")


def loggers_problem(value: list) -> str | None:
    """For the LOGGERS knob check: unknown or repeated names, or a tracker whose package is missing."""
    bad = [v for v in value if v not in LOGGERS]
    if bad:
        return f"unknown logger(s) {bad}; known: {list(LOGGERS)}"
    if len(set(value)) != len(value):
        return f"a logger is named twice: {value}"
    for name, package in (("tensorboard", "tensorboardX"), ("wandb", "wandb")):
        if name in value and not _installed(package):  # said before any work starts
            return f"'{name}' needs the {package} package, not installed here: pip install {package} (or leave it out of LOGGERS)"
    return None


def _installed(package: str) -> bool:
    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None
