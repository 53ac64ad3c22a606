"""Guards of the run folder and of resume: a plain RUN_NAME, no fresh run over an old one, same knobs.

A resumed run must train the function and walk the data plan that its checkpoint did; the knobs that
decide either are compared with the checkpoint's `config.json` before any weight is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# RESUME_FIXED / RESUME_SAFE come from the knobs' resume= rules (config/train.py) and the RUN_NAME rule
# from config/rules.py: the schema checks them too
from kohakumoss.adapters.algos import trained_forward
from kohakumoss.config.rules import FLAT_SCHEDULES, run_name_problem
from kohakumoss.config.train import LENGTH_KNOBS, RESUME_FIXED, RESUME_SAFE, RunConfig, TrainConfig
from kohakumoss_common.errors import ConfigError

# what a run that trained writes into its folder (a run that failed during setup leaves only config.json
# and log.txt: the fixed command may then start fresh in the same folder)
_RUN_FILES = ("metrics.jsonl", "checkpoints", "export")


def check_run_folder(run: RunConfig, run_dir: Path) -> None:
    """Refuse a fresh run (RESUME empty) into a folder that holds a previous run's files."""
    if problem := run_name_problem(run.run_name):
        raise ConfigError("RUN_NAME", problem)
    if run.resume or not run_dir.is_dir():
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


def _compared(name: str, knobs: dict[str, Any]) -> Any:
    return trained_forward(knobs) if name == "BYPASS" else _as_saved(knobs[name])


def changed_knobs(saved: dict[str, Any], k: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{knob: (saved, now)} for every compared knob that differs (knobs an older checkpoint lacks are
    skipped); BYPASS by the function its forward trains (`algos.trained_forward`), so a run saved with
    BYPASS=False resumes under 'auto'."""
    out = {}
    for name in (*RESUME_FIXED, *RESUME_SAFE):
        if name in saved and name in k and _compared(name, k) != _compared(name, saved):
            out[name] = (saved[name], _as_saved(k[name]))
    return out


def check_resume_knobs(cfg: TrainConfig, checkpoint: Path) -> list[str]:
    """Refuse a resume whose knobs differ from the checkpoint's; returns the allowed changes (to log).
    Compared as the flat knobs: the checkpoint's config.json is that dict."""
    config_file = checkpoint / "config.json"
    try:
        saved = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("RESUME", f"{config_file}: cannot read the checkpoint's knobs ({e})") from e
    allowed = set(cfg.run.resume_allow_changes)
    if cfg.optim.lr_schedule in FLAT_SCHEDULES and saved.get("LR_SCHEDULE") in FLAT_SCHEDULES:
        allowed |= set(LENGTH_KNOBS)  # a longer (or shorter) run: every step's LR and batch stay the same
    changes = changed_knobs(saved, cfg.knobs())
    refused = {n: v for n, v in changes.items() if n not in allowed}
    if refused:
        listed = ", ".join(f"{n} {old!r} -> {new!r}" for n, (old, new) in refused.items())
        safe = [n for n in refused if n in RESUME_SAFE]
        hint = f"; to accept {safe}, list them in RESUME_ALLOW_CHANGES" if safe else ""
        if any(n in refused for n in LENGTH_KNOBS):
            hint += (
                f" (LR_SCHEDULE '{cfg.optim.lr_schedule}' spreads its decay over STEPS: the steps after the "
                "checkpoint follow the new length's curve, whose LR there differs from the one the run had)"
            )
        raise ConfigError(
            "RESUME",
            f"{checkpoint} was trained with other knobs: {listed}{hint}; "
            "or start fresh under another RUN_NAME",
        )
    return [f"{n} {old!r} -> {new!r}" for n, (old, new) in changes.items()]
