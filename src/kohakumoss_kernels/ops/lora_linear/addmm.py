"""lora_linear with the LoRA up-projection and the add in one cuBLAS call: addmm(base, x down^T, up^T).

Saves the separate read and write of the [T, O] output that `base + scale * delta` costs in eager.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.addmm(F.linear(x2, weight, bias), F.linear(x2, down), up.t(), alpha=float(scale))
    return out.reshape(*lead, out.shape[-1])
