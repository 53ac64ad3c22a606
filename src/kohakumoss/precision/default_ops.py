"""The OpSet a quantized linear uses when no model handed it one (a linear built and called on its own)."""

from __future__ import annotations

from functools import cache

from kohakumoss_kernels import OpSet


@cache
def default_ops() -> OpSet:
    return OpSet()
