"""launch.run over a test's knob dict: its DistributedConfig and DEVICE typed, each worker's fn(k) called with
DEVICE set to the worker's own device (the tests' workers read more keys than the run's config has)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kohakumoss.distributed import run
from kohakumoss.distributed.config import DistributedConfig
from kohakumoss_common.typed_config import from_knobs


def run_knobs(k: dict[str, Any], fn: Callable[[dict[str, Any]], Any]) -> Any:
    return run(
        from_knobs(DistributedConfig, k), k.get("DEVICE", "auto"), functools.partial(_on_device, k, fn)
    )


def _on_device(k: dict[str, Any], fn: Callable[[dict[str, Any]], Any], device: str) -> Any:
    return fn({**k, "DEVICE": device})
