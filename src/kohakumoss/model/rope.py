"""Rotary angles over (text index, row, column): each axis owns a slice of the head dim."""

from __future__ import annotations

import torch


def rope_frequencies(
    axes: tuple[int, ...], theta: float, device: torch.device | str | None = None
) -> list[torch.Tensor]:
    """Per axis, the inverse frequencies of its dim/2 rotation pairs (float64 for exact angles).

    Made on `device` directly: a host-to-device copy per forward would stall it and break graph capture.
    """
    return [1.0 / (theta ** (torch.arange(0, a, 2, dtype=torch.float64, device=device) / a)) for a in axes]


def rope_cos_sin(
    positions: torch.Tensor, axes: tuple[int, ...], theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T, n_axes] -> cos, sin [T, head_dim / 2] float32, axis blocks concatenated."""
    freqs = rope_frequencies(axes, theta, positions.device)
    angles = torch.cat(
        [positions[:, i : i + 1].double() * f[None, :] for i, f in enumerate(freqs)],
        dim=1,
    )
    return angles.cos().float(), angles.sin().float()
