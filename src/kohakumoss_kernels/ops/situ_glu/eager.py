"""SiTU-GLU on a fused projection h = [hidden | gate] (halves along the last dim):

    out = (4 tanh(gate / 4) sigmoid(gate)) * (25 tanh(hidden / 25))

a soft-capped SiLU-like gate times a soft-capped hidden half, computed in float32.
"""

from __future__ import annotations

import torch


def situ_glu(h: torch.Tensor) -> torch.Tensor:
    hidden, gate = h.float().chunk(2, dim=-1)
    act = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate)
    return (act * (25.0 * torch.tanh(hidden / 25.0))).to(h.dtype)
