"""Sigma sampling for training: uniform, logit-normal or SD3's mode sampling, then an optional static or
resolution shift.

Sampling does not use these shifts: it follows the released schedule (schedule.py).

Convention: sigma = 1 is pure noise, sigma = 0 is the clean image; x_t = (1 - sigma) x0 + sigma noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kohakumoss_common.errors import ConfigError

SIGMA_MODES = ("uniform", "logit_normal", "mode")
# SD3 (Esser et al. 2024, eq. 20): f_mode is monotonic, so a valid sampler, for -1 <= s <= 2 / (pi - 2)
MODE_SCALE_RANGE = (-1.0, 2 / (math.pi - 2))
SHIFT_MODES = ("none", "static", "resolution")


@dataclass(frozen=True)
class TimestepConfig:
    mode: str = "logit_normal"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29  # s of mode sampling (SD3's default; 0 is uniform, > 0 favours mid sigmas)
    shift: str = "resolution"  # none | static | resolution
    static_shift: float = 3.0
    base_tokens: int = 256  # image tokens at which the resolution shift is base_shift
    max_tokens: int = 4096  # image tokens at which it is max_shift (1 MP)
    base_shift: float = 0.5
    max_shift: float = 1.15

    def __post_init__(self) -> None:
        if self.mode not in SIGMA_MODES:
            raise ConfigError("TIMESTEP_SAMPLING", f"'{self.mode}' is not one of {SIGMA_MODES}")
        lo, hi = MODE_SCALE_RANGE
        if not lo <= self.mode_scale <= hi:
            raise ConfigError(
                "MODE_SCALE", f"must be in [{lo}, {hi:.4f}] (monotonic f_mode), got {self.mode_scale}"
            )
        if self.shift not in SHIFT_MODES:
            raise ConfigError("TIMESTEP_SHIFT", f"'{self.shift}' is not one of {SHIFT_MODES}")
        if self.static_shift <= 0:
            raise ConfigError("TIMESTEP_STATIC_SHIFT", f"must be > 0, got {self.static_shift}")


def shift_sigma(sigma: torch.Tensor, shift: torch.Tensor | float) -> torch.Tensor:
    """sigma' = shift * sigma / (1 + (shift - 1) * sigma): shift > 1 spends more time at high noise."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def resolution_mu(image_tokens: torch.Tensor, cfg: TimestepConfig) -> torch.Tensor:
    """log-shift growing linearly with image tokens (FLUX / SD3 style), per sample."""
    slope = (cfg.max_shift - cfg.base_shift) / (cfg.max_tokens - cfg.base_tokens)
    return cfg.base_shift + slope * (image_tokens.double() - cfg.base_tokens)


def shift_for(image_tokens: torch.Tensor, cfg: TimestepConfig) -> torch.Tensor:
    """The multiplicative shift each sample gets under `cfg` (1 where no shift applies)."""
    if cfg.shift == "none":
        return torch.ones_like(image_tokens, dtype=torch.float64)
    if cfg.shift == "static":
        return torch.full_like(image_tokens, cfg.static_shift, dtype=torch.float64)
    return torch.exp(resolution_mu(image_tokens, cfg))


def draw_sigmas(
    cfg: TimestepConfig, image_tokens: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One sigma per sample in (0, 1), float32 on the CPU (deterministic given the generator)."""
    n = image_tokens.shape[0]
    if cfg.mode == "uniform":
        sigma = torch.rand(n, generator=generator, dtype=torch.float64)
    elif cfg.mode == "mode":
        sigma = mode_sigma(torch.rand(n, generator=generator, dtype=torch.float64), cfg.mode_scale)
    else:
        sigma = torch.sigmoid(
            cfg.logit_mean + cfg.logit_std * torch.randn(n, generator=generator, dtype=torch.float64)
        )
    sigma = shift_sigma(sigma, shift_for(image_tokens.cpu(), cfg))
    return sigma.clamp(1e-5, 1 - 1e-5).float()


def mode_sigma(u: torch.Tensor, scale: float) -> torch.Tensor:
    """SD3's f_mode(u; s) = 1 - u - s (cos^2(pi u / 2) - 1 + u) of uniform u; symmetric about 1/2."""
    return 1 - u - scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)


def logit_normal_density(
    sigma: torch.Tensor,
    mean: float = TimestepConfig.logit_mean,
    std: float = TimestepConfig.logit_std,
) -> torch.Tensor:
    """Density of the logit-normal distribution (used to check the sampler and for weighting)."""
    logit = torch.log(sigma / (1 - sigma))
    return torch.exp(-((logit - mean) ** 2) / (2 * std**2)) / (
        std * math.sqrt(2 * math.pi) * sigma * (1 - sigma)
    )
