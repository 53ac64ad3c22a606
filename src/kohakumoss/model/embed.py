"""The timestep embedder: float64 sinusoids of sigma * 1000, then Linear, SiLU, Linear (`time_embedding`)."""

from __future__ import annotations

import torch
from torch import nn


def timestep_features(
    sigma: torch.Tensor, dim: int, scale: float = 1000.0, max_period: float = 10000.0
) -> torch.Tensor:
    """[B] -> [B, dim] float32: [cos, sin] of t * max_period^(-k / (dim / 2)), t = float32(sigma * scale),
    the phases in float64 as the released code computes them."""
    half = dim // 2
    freqs = max_period ** (-torch.arange(half, dtype=torch.float64, device=sigma.device) / half)
    t = (sigma.float() * scale).double()
    phase = t[:, None] * freqs[None, :]
    return torch.cat([phase.cos(), phase.sin()], dim=-1).float()


class TimestepEmbedding(nn.Sequential):
    """Keys `time_embedding.0` and `time_embedding.2`, as in the released checkpoint."""

    def __init__(self, freq_dim: int, dim: int, scale: float):
        super().__init__(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.freq_dim, self.scale = freq_dim, scale

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        feats = timestep_features(sigma, self.freq_dim, self.scale)
        return super().forward(feats.to(self[0].weight.dtype))
