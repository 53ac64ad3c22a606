"""Rotary angles over four axes (r, t, h, w), computed in float32 as the released model was trained.

Each axis owns `head_dim / 8` bands, theta^(-k / bands); the head's 64 frequencies are ordered
[r | t | h | w] and rotate the pairs (i, i + head_dim / 2) (rotate-half layout). Image tokens sit at
(0, text_len, row - (rows - 1) / 2, col - (cols - 1) / 2), text token j at (0, j, 0, 0): see PackedSeq.
"""

from __future__ import annotations

import torch
from torch import nn


def rope_bands(head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """The per-axis bands [head_dim / 8] in float32, built like the released code (float32 powers)."""
    n = head_dim // 8
    exponent = torch.arange(n, dtype=torch.float32, device=device) / n
    return 1.0 / (theta**exponent)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T, 4] float32 -> cos, sin [T, head_dim / 2] float32 (axes r, t, h, w concatenated)."""
    bands = rope_bands(head_dim, theta, positions.device)
    phase = (positions.float()[:, :, None] * bands).flatten(1)
    return phase.cos(), phase.sin()


class RotaryBands(nn.Module):
    """Holds `rope.bands`, a derived constant the released checkpoint stores; the forward recomputes it
    in float32 (a bf16 copy of it could not be recovered), so the buffer only keeps the key."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.register_buffer("bands", rope_bands(head_dim, theta))
