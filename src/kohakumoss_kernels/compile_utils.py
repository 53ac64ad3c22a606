"""The torch.compile backend the registry makes of every op: its reference compiled once per process, lazily."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def compiled(fn: Callable) -> Callable:
    """fn under torch.compile (dynamic shapes after the first recompile), compiled on first call."""
    holder: dict[str, Callable] = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "fn" not in holder:
            _allow_recompiles(64)
            holder["fn"] = torch.compile(fn, dynamic=None)
        return holder["fn"](*args, **kwargs)

    return call


def _allow_recompiles(limit: int) -> None:
    """One op is called with many shapes, scales and bias/no-bias per model; dynamo's default of 8
    compiled variants per function ran out on the 5B model and fell back to eager silently."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def supports(arch: str, dtype: torch.dtype) -> bool:
    return True
