"""The released sampler: Euler on the velocity, classifier-free guidance with skip-layer guidance.

Per step i of n (sigmas from `released_sigmas`, float32):
    cond   = backbone(x, text, sigma_i)
    uncond = backbone(x, negative, sigma_i, skip_layers)   skip_layers while slg_start <= i/n < slg_stop
    v      = uncond + cfg * (cond - uncond)                float32
    x      = x + (sigma_{i+1} - sigma_i) * v               x float32; v = noise - x0 (objective.py)

Initial noise per image: float32 `torch.randn(1, C, h, w)` from a CPU generator seeded with the image's
seed, as the released pipeline draws it; its [C, h, w] grid is the image's tokens row-major with C
features (encoders/latents.py). So a seed gives the released pipeline's noise, whatever else is in the
batch. The images of a batch run packed on one token axis; the unconditional branch is a call of its
own while it skips blocks, else it rides in the conditional call (one backbone call per step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kohakumoss.model.seq import PackedSeq
from kohakumoss_common.errors import ConfigError

from .schedule import RELEASED_SHIFT, released_sigmas

RELEASED_UNCOND_SKIP_LAYERS = (22,)  # 0-indexed block the released sampler leaves out of the uncond branch


@dataclass(frozen=True)
class SamplerConfig:
    """The released settings by default (50 steps, CFG 3, shift 5, uncond skips block 22 at every step).

    slg_start / slg_stop: the fraction of the steps (i / n, start inclusive, stop exclusive) during which
    the unconditional branch skips `uncond_skip_layers`.
    """

    steps: int = 50
    cfg_scale: float = 3.0
    shift: float = RELEASED_SHIFT
    uncond_skip_layers: tuple[int, ...] = RELEASED_UNCOND_SKIP_LAYERS
    slg_start: float = 0.0
    slg_stop: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "uncond_skip_layers", tuple(self.uncond_skip_layers))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError("STEPS", f"must be a whole number >= 1, got {self.steps!r}")
        if not math.isfinite(self.cfg_scale) or self.cfg_scale < 0:
            raise ConfigError("CFG", f"must be finite and >= 0, got {self.cfg_scale!r}")
        if not math.isfinite(self.shift) or self.shift <= 0:
            raise ConfigError("SHIFT", f"must be finite and > 0, got {self.shift!r}")
        if not 0 <= self.slg_start <= self.slg_stop <= 1:
            raise ConfigError(
                "SLG_START", f"need 0 <= SLG_START <= SLG_STOP <= 1, got {self.slg_start}, {self.slg_stop}"
            )
        bad = [i for i in self.uncond_skip_layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ConfigError("UNCOND_SKIP_LAYERS", f"block indices are whole numbers >= 0, got {bad}")

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    def check_depth(self, depth: int) -> None:
        """A skip index the model does not have is an error, not a silent no-op."""
        missing = sorted(i for i in set(self.uncond_skip_layers) if i >= depth)
        if missing:
            raise ConfigError(
                "UNCOND_SKIP_LAYERS",
                f"blocks {missing} do not exist in this {depth}-block model (indices 0..{depth - 1}); "
                "[] turns skip-layer guidance off",
            )

    def skip_at(self, i: int, n: int) -> tuple[int, ...]:
        """The blocks the unconditional branch leaves out at step i of n."""
        return self.uncond_skip_layers if self.slg_start <= i / n < self.slg_stop else ()


def released_uncond_skip_layers(depth: int) -> tuple[int, ...]:
    """The released skip where the model has that block, else none (small test models)."""
    return tuple(i for i in RELEASED_UNCOND_SKIP_LAYERS if i < depth)


def initial_noise(grid: tuple[int, int], seed: int, channels: int = 128) -> torch.Tensor:
    """The released pipeline's starting noise for one image as tokens [h * w, channels], float32."""
    h, w = grid
    generator = torch.Generator("cpu").manual_seed(int(seed))
    z = torch.randn(1, channels, h, w, generator=generator, dtype=torch.float32)
    return z[0].reshape(channels, h * w).T.contiguous()


def backbone_depth(backbone: Callable[..., torch.Tensor]) -> int | None:
    config = getattr(backbone, "config", None)
    return getattr(config, "depth", None)


def _call(backbone, img, text, sigma, seq, skip: tuple[int, ...]) -> torch.Tensor:
    if skip:
        return backbone(img, text, sigma, seq, skip_layers=frozenset(skip)).float()
    return backbone(img, text, sigma, seq).float()


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
    """cond / uncond: per-image text hidden states; returns the clean latent tokens [h*w, C] per image.

    The uncond branch runs when `uncond` is given and CFG != 1. A backbone with a `config.depth` has
    its skip indices checked against it first (ConfigError naming UNCOND_SKIP_LAYERS).
    """
    guided = uncond is not None and config.guided
    depth = backbone_depth(backbone)
    if guided and depth is not None:
        config.check_depth(depth)
    sigmas = released_sigmas(config.steps, config.shift).to(device)
    n = sigmas.numel() - 1
    B = len(cond)
    seq_c = PackedSeq.build([t.shape[0] for t in cond], img_sizes, device)
    text_c = torch.cat([t.to(device, dtype) for t in cond])
    if guided:
        seq_u = PackedSeq.build([t.shape[0] for t in uncond], img_sizes, device)
        text_u = torch.cat([t.to(device, dtype) for t in uncond])
        seq_both = PackedSeq.build([t.shape[0] for t in [*cond, *uncond]], [*img_sizes, *img_sizes], device)
        text_both = torch.cat([text_c, text_u])
    x = torch.cat([initial_noise(g, s, in_channels) for g, s in zip(img_sizes, seeds)]).to(device)
    T = x.shape[0]
    for i in range(n):
        sigma = sigmas[i].expand(B)
        img = x.to(dtype)
        skip = config.skip_at(i, n) if guided else ()
        if not guided:
            v = _call(backbone, img, text_c, sigma, seq_c, ())
        elif not skip:  # both branches in one packed call
            both = _call(backbone, torch.cat([img, img]), text_both, torch.cat([sigma, sigma]), seq_both, ())
            v_c, v_u = both[:T], both[T:]
            v = v_u + config.cfg_scale * (v_c - v_u)
        else:
            v_c = _call(backbone, img, text_c, sigma, seq_c, ())
            v_u = _call(backbone, img, text_u, sigma, seq_u, skip)
            v = v_u + config.cfg_scale * (v_c - v_u)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
        if progress is not None:
            progress(i + 1, n)
    return list(torch.split(x, [h * w for h, w in img_sizes]))
