"""Programmatic dependent launch (CUDA, sm90 and later): a row kernel launched with it is scheduled while
the kernel before it in the stream is still finishing, and waits for that kernel's writes at its first
line (`wait_inputs`), so the launch gap between two short kernels overlaps the first one's tail. Off
with KOHAKUMOSS_PDL=0, and wherever the card, the interpreter or the Triton build cannot do it."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .triton_utils import interpreting

try:  # Triton builds for other vendors may not have it
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton build
    gdc_wait = None

ENV = "KOHAKUMOSS_PDL"


def enabled(x: torch.Tensor) -> bool:
    """Whether kernels writing or reading `x` launch dependent: a CUDA card of sm90 or later."""
    if gdc_wait is None or interpreting() or os.environ.get(ENV, "1") == "0":
        return False
    return x.device.type == "cuda" and _sm_major(x.device.index) >= 9


@functools.lru_cache(maxsize=16)
def _sm_major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]


def options(x: torch.Tensor) -> dict:
    """Launch keywords of a kernel that starts with `wait_inputs(PDL)`: {} where PDL is off."""
    return {"PDL": True, "launch_pdl": True} if enabled(x) else {}


@triton.jit
def wait_inputs(PDL: tl.constexpr):
    """A dependent launch's first line: nothing the kernel before it wrote is read before this."""
    if PDL:
        gdc_wait()
