"""Text to image: encode prompts, run the Euler CFG sampler on the backbone, decode with the VAE.

The glue between the encoders, the sampler and the VAE; no state of its own. A request with reference
images (an edit model's input) has them VAE-encoded as training encodes them (references.py) and
placed after its text; a text encoder that puts references in its prompt sees them before both the
prompt and the negative prompt (both CFG branches get them, as SimpleTuner's pipeline does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from PIL import Image

from kohakumoss.encoders.latents import unpatchify
from kohakumoss_common.errors import ConfigError

from .references import read_reference, reference_grids
from .sampler import DEFAULT_SPEED, SamplerConfig, SamplerSpeed, euler_sample

PIXELS_PER_TOKEN = 16  # 8x VAE down-sampling, then 2x2 patches


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    seed: int
    width: int = 1024
    height: int = 1024
    negative: str = ""
    steps: int | None = None  # this request's sampler steps (None: the SamplerConfig's)
    cfg: float | None = None  # this request's guidance scale (None: the SamplerConfig's)
    references: tuple[str, ...] = ()  # reference image paths (an edit model's input), in order

    def sampler(self, config: SamplerConfig) -> SamplerConfig:
        """`config` with this request's steps and guidance scale."""
        steps = config.steps if self.steps is None else self.steps
        cfg = config.cfg_scale if self.cfg is None else self.cfg
        return replace(config, steps=steps, cfg_scale=cfg)

    def token_grid(self) -> tuple[int, int]:
        for knob, v in (("WIDTH", self.width), ("HEIGHT", self.height)):
            if v <= 0 or v % PIXELS_PER_TOKEN:
                raise ConfigError(knob, f"{v} must be a positive multiple of {PIXELS_PER_TOKEN} px")
        return self.height // PIXELS_PER_TOKEN, self.width // PIXELS_PER_TOKEN


def split_packed(hidden: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.split(hidden, lengths.tolist()))


def encode_prompts(
    text_encoder, prompts: list[str], references: list[list[Image.Image]]
) -> list[torch.Tensor]:
    """Per prompt its hidden states; an encoder that puts references in its prompt is given them."""
    if getattr(text_encoder, "references_in_prompt", False) and any(references):
        return split_packed(*text_encoder.encode(prompts, references))
    return split_packed(*text_encoder.encode(prompts))


def to_pil(pixels: torch.Tensor) -> Image.Image:
    """[3, H, W] in [-1, 1] -> an RGB PIL image."""
    arr = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(np.ascontiguousarray(arr), "RGB")


@torch.no_grad()
def generate_latents(
    backbone: Callable[..., torch.Tensor],
    text_encoder,
    requests: Sequence[GenerationRequest],
    config: SamplerConfig,
    in_channels: int = 128,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    speed: SamplerSpeed = DEFAULT_SPEED,
    vae=None,
) -> list[torch.Tensor]:
    """Latents [32, H/8, W/8] per request (normalized, as the VAE's decode takes them).

    Requests with their own steps or guidance scale are sampled in one call per setting, in order.
    vae: encodes the requests' reference images (needed only when a request has some).
    """
    groups: dict[SamplerConfig, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(r.sampler(config), []).append(i)
    if len(groups) > 1 or (groups and next(iter(groups)) != config):
        out: list[torch.Tensor] = [None] * len(requests)  # type: ignore[list-item]
        for sub, idx in groups.items():
            plain = [replace(requests[i], steps=None, cfg=None) for i in idx]
            for i, z in zip(
                idx,
                generate_latents(
                    backbone, text_encoder, plain, sub, in_channels, device, dtype, progress, speed, vae
                ),
            ):
                out[i] = z
        return out
    images = {p: read_reference(p) for r in requests for p in r.references}
    pictures = [[images[p] for p in r.references] for r in requests]
    cond = encode_prompts(text_encoder, [r.prompt for r in requests], pictures)
    uncond = (
        encode_prompts(text_encoder, [r.negative for r in requests], pictures)
        if config.cfg_scale != 1.0
        else None
    )
    grids = [r.token_grid() for r in requests]
    references = None
    if images:
        if vae is None:
            raise ConfigError("REFERENCE_IMAGES", "reference images need the VAE (set VAE) to encode them")
        references = [reference_grids(vae, p, (r.width, r.height)) for r, p in zip(requests, pictures)]
    tokens = euler_sample(
        backbone,
        cond,
        uncond,
        grids,
        [r.seed for r in requests],
        config,
        in_channels,
        device,
        dtype,
        progress,
        speed,
        references,
    )
    return [unpatchify(t.float().cpu(), 2 * h, 2 * w) for t, (h, w) in zip(tokens, grids)]


@torch.no_grad()
def generate(
    backbone: Callable[..., torch.Tensor],
    text_encoder,
    vae,
    requests: Sequence[GenerationRequest],
    config: SamplerConfig,
    in_channels: int = 128,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    speed: SamplerSpeed = DEFAULT_SPEED,
) -> list[Image.Image]:
    latents = generate_latents(
        backbone, text_encoder, requests, config, in_channels, device, dtype, progress, speed, vae
    )
    return [to_pil(vae.decode(z[None])[0]) for z in latents]
