"""The torch.compile backend: the eager op compiled once per process, lazily on first call."""

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
            holder["fn"] = torch.compile(fn, dynamic=None)
        return holder["fn"](*args, **kwargs)

    return call


def supports(arch: str, dtype: torch.dtype) -> bool:
    return True
