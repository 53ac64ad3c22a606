"""Guards of the run folder and of resume: a plain RUN_NAME, no fresh run over an old one, same knobs.

A resumed run must train the function and walk the data plan that its checkpoint did; the knobs that
decide either are compared with the checkpoint's `config.json` before any weight is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kohakumoss.data_knobs import PLAN_KNOBS, SCAN_KNOBS
from kohakumoss_common.errors import ConfigError

# the knobs that decide the data plan: the data package's own tables (workers only change the speed)
_PLAN = tuple(n for n in (*SCAN_KNOBS, *PLAN_KNOBS) if n != "SCAN_WORKERS")
# changing one of these mid-run trains another function or walks another data plan: never allowed
RESUME_FIXED = (
    "MODEL_PRESET",
    "TEXT_TEMPLATE",
    "TEXT_LAYERS",
    "TEXT_ENCODER_QUANT",
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
    "STEPS",
    "GRAD_CLIP",
    "EMA_DECAY",
    "EMA_WARMUP",
    "EMA_EVERY",
)
# what a run that trained writes into its folder (a run that failed during setup leaves only config.json
# and log.txt: the fixed command may then start fresh in the same folder)
_RUN_FILES = ("metrics.jsonl", "checkpoints", "export")


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


def check_run_folder(k: dict[str, Any], run_dir: Path) -> None:
    """Refuse a fresh run (RESUME empty) into a folder that holds a previous run's files."""
    if problem := run_name_problem(k["RUN_NAME"]):
        raise ConfigError("RUN_NAME", problem)
    if k["RESUME"] or not run_dir.is_dir():
        return
    found = [name for name in _RUN_FILES if (run_dir / name).exists()]
    if found:
        raise ConfigError(
            "RUN_NAME",
            f"run folder {run_dir} already holds a run ({', '.join(found)}): continue it with "
            "RESUME='latest', or start fresh under another RUN_NAME",
        )


def _as_saved(value: Any) -> Any:
    """A knob's value as config.json stores it (tuples become lists, odd types strings)."""
    return json.loads(json.dumps(value, default=str))


def changed_knobs(saved: dict[str, Any], k: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{knob: (saved, now)} for every compared knob that differs (knobs an older checkpoint lacks are skipped)."""
    out = {}
    for name in (*RESUME_FIXED, *RESUME_SAFE):
        if name in saved and name in k and _as_saved(k[name]) != saved[name]:
            out[name] = (saved[name], _as_saved(k[name]))
    return out


def check_resume_knobs(k: dict[str, Any], checkpoint: Path) -> list[str]:
    """Refuse a resume whose knobs differ from the checkpoint's; returns the allowed changes (to log)."""
    config_file = checkpoint / "config.json"
    try:
        saved = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("RESUME", f"{config_file}: cannot read the checkpoint's knobs ({e})") from e
    allowed = set(k.get("RESUME_ALLOW_CHANGES") or ())
    changes = changed_knobs(saved, k)
    refused = {n: v for n, v in changes.items() if n not in allowed}
    if refused:
        listed = ", ".join(f"{n} {old!r} -> {new!r}" for n, (old, new) in refused.items())
        safe = [n for n in refused if n in RESUME_SAFE]
        hint = f"; to accept {safe}, list them in RESUME_ALLOW_CHANGES" if safe else ""
        raise ConfigError(
            "RESUME",
            f"{checkpoint} was trained with other knobs: {listed}{hint}; "
            "or start fresh under another RUN_NAME",
        )
    return [f"{n} {old!r} -> {new!r}" for n, (old, new) in changes.items()]
