"""The torch.compile backend the registry makes of every op: its reference compiled once per process, lazily."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.utils.checkpoint

# exceptions torch raises through an op on purpose: activation checkpointing ends a recomputation with one
_CONTROL_FLOW = tuple(
    e for e in (getattr(torch.utils.checkpoint, "_StopRecomputationError", None),) if e is not None
)


class CompileFailed(RuntimeError):
    """torch.compile's code for an op raised: the registry tries the next backend (the reference last)."""


def compiled(fn: Callable) -> Callable:
    """fn under torch.compile (dynamic shapes after the first recompile), compiled on first call.

    Any error raised there becomes CompileFailed: Inductor's generated code fails with whatever Python
    raises (torch 2.11 at the attention's dynamic shapes: a NameError on an undefined size symbol), and
    the reference, tried after it, still raises the caller's own errors as they are."""
    holder: dict[str, Callable] = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "fn" not in holder:
            _allow_recompiles(64)
            holder["fn"] = torch.compile(fn, dynamic=None)
        try:
            return holder["fn"](*args, **kwargs)
        except (RuntimeError, *_CONTROL_FLOW):
            raise
        except Exception as e:
            raise CompileFailed(f"torch.compile of {fn.__name__}: {type(e).__name__}: {e}") from e

    return call


def _allow_recompiles(limit: int) -> None:
    """One op is called with many shapes, scales and bias/no-bias per model; dynamo's default of 8
    compiled variants per function ran out on the 5B model and fell back to eager silently."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def supports(arch: str, dtype: torch.dtype) -> bool:
    return True
