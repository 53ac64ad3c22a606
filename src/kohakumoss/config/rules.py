"""Knob rules that both the schema (config/train.py, checked before any work starts) and the trainer apply:
which knobs a resumed run may change, what a run folder may be named, which trackers exist.

They live below the trainer so that the typed config can check them without importing `kohakumoss.train`
(the trainer imports the config).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from kohakumoss.data_knobs import PLAN_KNOBS, SCAN_KNOBS

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
# the run's length: a resumed run under a FLAT_SCHEDULES schedule may change them without RESUME_ALLOW_CHANGES
# (the plan's first steps, the weights, the optimizer state and every step's LR stay what they were)
LENGTH_KNOBS = ("STEPS", "EPOCHS")

# the knobs that decide the data plan: the data package's own tables (workers only change the speed)
# (EPOCHS only lengthens the plan: its first steps stay the same, so it is a length knob below)
_PLAN = tuple(n for n in (*SCAN_KNOBS, *PLAN_KNOBS) if n not in ("SCAN_WORKERS", "EPOCHS"))
# changing one of these mid-run trains another function or walks another data plan: never allowed
RESUME_FIXED = (
    "MODEL_PRESET",
    "TEXT_TEMPLATE",
    "TEXT_LAYERS",
    "TEXT_ENCODER_QUANT",
    "REFERENCES_IN_PROMPT",  # an edit run's text tokens (vision tokens before the caption, or none)
    "ENCODER_PRECISION",  # the text embeddings and latents a step trains on
    "PRECISION",
    "BASE_PRECISION",
    "ALGO",
    "RANK",
    "ALPHA",
    "ALGO_ARGS",
    "TARGET_PRESET",
    "TARGET_PATTERNS",
    "BYPASS",
    "USE_MUON",
    "DATASET",
    "BUCKETS",
    *_PLAN,
    "VAL_ITEMS",
    "GRAD_ACCUM",
    "SEED",
    "EMA",
    "TIMESTEP_SAMPLING",
    "LOGIT_MEAN",
    "LOGIT_STD",
    "TIMESTEP_SHIFT",
    "STATIC_SHIFT",
    "LOSS_WEIGHTING",
    "LOSS_REDUCTION",
    "MODE_SCALE",
    "MIN_SNR_GAMMA",
    "LOSS_TYPE",
    "HUBER_C",
    "OPTIMIZER",  # another optimizer's state does not load
)
# compared too, but RESUME_ALLOW_CHANGES may let them through: the weights, optimizer state and data
# position stay valid (optimisation and schedule settings, regularisers, the same files moved)
RESUME_SAFE = (
    "WEIGHTS",
    "TEXT_ENCODER",
    "TOKENIZER",  # compared as TEXT_ENCODER is: the token ids a step encodes; allowed only when moved
    "VAE",
    "DROPOUT",
    "RANK_DROPOUT",
    "MODULE_DROPOUT",
    "LORA_PLUS_RATIO",
    "LR",
    "MUON_LR",
    "WEIGHT_DECAY",
    "OPTIMIZER_ARGS",
    "LR_SCHEDULE",
    "LR_WARMUP_STEPS",
    "LR_MIN_RATIO",
    "LR_CYCLES",
    "LR_POWER",
    "STEPS",
    "EPOCHS",
    "GRAD_CLIP",
    "EMA_DECAY",
    "EMA_WARMUP",
    "EMA_EVERY",
)


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run folder's name (it must stay under RUNS_DIR), or None."""
    if not name or name in (".", ".."):
        return f"{name!r} is not a folder name"
    if "/" in name or "\\" in name or Path(name).is_absolute():
        return f"{name!r} is a path: RUN_NAME is a plain folder name under RUNS_DIR"
    return None


def allow_changes_problem(names: list) -> str | None:
    """RESUME_ALLOW_CHANGES may name only the knobs that are safe to change on resume."""
    bad = [n for n in names if n not in RESUME_SAFE]
    if not bad:
        return None
    fixed = [n for n in bad if n in RESUME_FIXED]
    why = f"{fixed} change the trained function or the data plan" if fixed else f"{bad} are not compared"
    return f"{why}; only these may be allowed: {list(RESUME_SAFE)}"


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
