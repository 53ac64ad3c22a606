"""Input embedders: the timestep MLP that feeds every block's AdaLN."""

from __future__ import annotations

import math

import torch
from torch import nn


def timestep_features(
    sigma: torch.Tensor, dim: int, scale: float = 1000.0, max_period: float = 10000.0
) -> torch.Tensor:
    """Sinusoidal features of sigma * scale: [B] -> [B, dim] float32 (cos half, then sin half)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half
    )
    args = (sigma.float() * scale)[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbed(nn.Module):
    def __init__(self, freq_dim: int, out_dim: int, scale: float):
        super().__init__()
        self.freq_dim, self.scale = freq_dim, scale
        self.linear_1 = nn.Linear(freq_dim, out_dim)
        self.linear_2 = nn.Linear(out_dim, out_dim)

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        feats = timestep_features(sigma, self.freq_dim, self.scale).to(self.linear_1.weight.dtype)
        return self.linear_2(nn.functional.silu(self.linear_1(feats)))
