"""The Euler flow sampler with classifier-free guidance.

The conditional and unconditional passes run as ONE packed batch (2B samples on the token axis), so
guidance costs one backbone call per step. Noise comes from a per-sample CPU generator seeded by that
sample's seed: the same seed and settings give the same image, whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kohakumoss.model.seq import PackedSeq

from .timestep import TimestepConfig, shift_for


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = 32
    cfg_scale: float = 3.0
    shift: TimestepConfig = field(default_factory=lambda: TimestepConfig(shift="resolution"))


def sigma_schedule(steps: int, image_tokens: int, shift: TimestepConfig) -> torch.Tensor:
    """steps + 1 sigmas from 1 down to 0, shifted like training sigmas for this resolution."""
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    s = shift_for(torch.tensor([image_tokens]), shift)[0]
    return (s * t / (1 + (s - 1) * t)).float()


def initial_noise(
    img_sizes: Sequence[tuple[int, int]], seeds: Sequence[int], channels: int
) -> list[torch.Tensor]:
    return [
        torch.randn(h * w, channels, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float32)
        for (h, w), seed in zip(img_sizes, seeds)
    ]


@torch.no_grad()
def euler_sample(
    backbone: Callable[..., torch.Tensor],
    cond: Sequence[torch.Tensor],
    uncond: Sequence[torch.Tensor] | None,
    img_sizes: Sequence[tuple[int, int]],
    seeds: Sequence[int],
    config: SamplerConfig,
    in_channels: int = 128,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
) -> list[torch.Tensor]:
    """cond / uncond: per-sample text hidden states; returns clean latent tokens [h*w, C] per sample."""
    guided = uncond is not None and config.cfg_scale != 1.0
    texts = list(cond) + (list(uncond) if guided else [])
    sizes = list(img_sizes) * (2 if guided else 1)
    seq = PackedSeq.build([t.shape[0] for t in texts], sizes, device)
    text = torch.cat([t.to(device, dtype) for t in texts])
    x = [z.to(device) for z in initial_noise(img_sizes, seeds, in_channels)]
    schedules = torch.stack([sigma_schedule(config.steps, h * w, config.shift) for h, w in img_sizes])
    lens = [h * w for h, w in img_sizes]
    for i in range(config.steps):
        sigma = schedules[:, i].to(device)
        img = torch.cat(x * (2 if guided else 1)).to(dtype)
        v = backbone(img, text, torch.cat([sigma, sigma]) if guided else sigma, seq).float()
        if guided:
            v_c, v_u = v[: sum(lens)], v[sum(lens) :]
            v = v_u + config.cfg_scale * (v_c - v_u)
        dt = (schedules[:, i + 1] - schedules[:, i]).tolist()
        x = [xi + d * vi for xi, d, vi in zip(x, dt, torch.split(v, lens))]
        if progress is not None:
            progress(i + 1, config.steps)
    return x
