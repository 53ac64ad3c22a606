"""SwiGLU activation on a fused gate/up projection: silu(h[:, :H]) * h[:, H:]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(h.dtype)
