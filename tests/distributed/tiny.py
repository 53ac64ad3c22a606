"""The trainer tests' tiny run (tests/trainer/conftest.py) for CPU workers: a short DIST_TIMEOUT, so a rank
that hangs fails its test in minutes instead of holding the 2-core CI for the default 30."""

from __future__ import annotations

from ..trainer.conftest import tiny_knobs as one_process_knobs
from ..trainer.conftest import train_world  # noqa: F401 (the fixture, for the test modules to import)

DIST_TIMEOUT_S = 120.0  # a slow 2-core machine with 3 ranks needs far less for any one collective


def tiny_knobs(world: dict, run_name: str, **overrides) -> dict:
    """tests/trainer's tiny_knobs with DIST_TIMEOUT short unless the test sets its own."""
    return one_process_knobs(world, run_name, **{"DIST_TIMEOUT": DIST_TIMEOUT_S, **overrides})
