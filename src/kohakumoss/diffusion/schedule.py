"""The released MOSS-Image sampling schedule: shifted sigmas snapped to the 1000-point training grid.

    v      = linspace(1, s / (T + s - 1), steps)            torch.linspace, float32
    sigma  = s * v / (1 + (s - 1) * v)                      s = shift (5 released)
    sigma  -> nearest point of the training grid            the same formula over T = 1000 points, s = 1
    consecutive duplicates dropped, then 0 appended

Float32 throughout with torch's own ops, as the released scheduler computes it, so the sigmas are the
same bits. Sigma 1 is pure noise; the model takes sigma and uses t = sigma * 1000 itself.
"""

from __future__ import annotations

import math

import torch

from kohakumoss_common.errors import ConfigError

RELEASED_SHIFT = 5.0
TRAIN_TIMESTEPS = 1000  # points of the training grid
TRAINING_SHIFT = 1.0  # the grid's own shift: 1 makes it linspace(1, 1/1000, 1000)


def shifted_grid(count: int, shift: float, total: int = TRAIN_TIMESTEPS) -> torch.Tensor:
    """`count` float32 sigmas from 1 down to the shifted image of 1/total."""
    lower = shift / (total + shift - 1)  # a Python float, as the released scheduler passes it
    v = torch.linspace(1, lower, count)
    return shift * v / (1 + (shift - 1) * v)


def snap_to_grid(sigmas: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Each sigma replaced by the nearest point of the ascending `grid` (ties to the lower point)."""
    upper = torch.searchsorted(grid, sigmas).clamp(max=grid.numel() - 1)
    lower = (upper - 1).clamp(min=0)
    nearest = torch.where((sigmas - grid[lower]).abs() <= (grid[upper] - sigmas).abs(), lower, upper)
    return grid[nearest]


def released_sigmas(
    steps: int,
    shift: float = RELEASED_SHIFT,
    training_shift: float = TRAINING_SHIFT,
    total: int = TRAIN_TIMESTEPS,
) -> torch.Tensor:
    """The float32 sigmas of a `steps`-step run, ending in 0; at most steps + 1 of them (duplicates dropped)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("STEPS", f"must be a whole number >= 1, got {steps!r}")
    if not math.isfinite(shift) or shift <= 0:
        raise ConfigError("SHIFT", f"must be finite and > 0, got {shift!r}")
    if not math.isfinite(training_shift) or training_shift <= 0:
        raise ConfigError("training_shift", f"must be finite and > 0, got {training_shift!r}")
    grid = shifted_grid(total, training_shift, total).flip(0)
    snapped = torch.unique_consecutive(snap_to_grid(shifted_grid(steps, shift, total), grid))
    return torch.cat([snapped, snapped.new_zeros(1)])
