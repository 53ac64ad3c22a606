"""The benchmark scripts as modules, for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def load_bench(name: str) -> ModuleType:
    """scripts/bench/<name>.py, run as a module (kept in sys.modules: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
