"""Op registry: each op name maps to backends in priority order; the eager backend is the reference.

This is the minimal registry the model is written against (`OpSet`); the per-arch priority lists,
build probes, per-shape tuning table and runtime fallback live here too as they are added.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# op name -> (module under ops/<op>/, function name)
_OPS: dict[str, str] = {
    "rms_norm": "rms_norm",
    "norm_modulate": "norm_modulate",
    "gated_residual": "gated_residual",
    "apply_rope": "rope",
    "swiglu": "swiglu",
    "varlen_attention": "varlen_attention",
}


def available_ops() -> list[str]:
    return sorted(_OPS)


def eager_op(op: str) -> Callable:
    """The reference implementation of `op`."""
    if op not in _OPS:
        raise KeyError(f"unknown op '{op}'; known: {available_ops()}")
    module = importlib.import_module(f"kohakumoss_kernels.ops.{_OPS[op]}.eager")
    return getattr(module, op)


@dataclass
class BoundOp:
    """An op bound for one (arch, dtype): the backends to try, in order."""

    op: str
    arch: str
    dtype: torch.dtype
    backends: list[tuple[str, Callable]] = field(default_factory=list)

    def __call__(self, *args, **kwargs):
        return self.backends[0][1](*args, **kwargs)


def resolve(op: str, arch: str, dtype: torch.dtype, backend: str = "auto") -> BoundOp:
    """Bind `op` for (arch, dtype). backend='eager' forces the reference."""
    del backend
    return BoundOp(op, arch, dtype, [("eager", eager_op(op))])


class OpSet:
    """The ops a model calls: `ops.rms_norm(x, w)`; each binds on first use per (device, dtype)."""

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self._bound: dict[tuple[str, str, torch.dtype], BoundOp] = {}

    def bind(self, op: str, device: torch.device, dtype: torch.dtype) -> BoundOp:
        from kohakumoss_common.device import device_info

        key = (op, str(device), dtype)
        if key not in self._bound:
            arch = device_info(device).arch if device.type != "cpu" else "cpu"
            self._bound[key] = resolve(op, arch, dtype, self.backend)
        return self._bound[key]

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in _OPS:
            raise AttributeError(op)

        def call(x: torch.Tensor, *args, **kwargs):
            return self.bind(op, x.device, x.dtype)(x, *args, **kwargs)

        return call
