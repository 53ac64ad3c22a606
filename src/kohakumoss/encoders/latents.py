"""FLUX.2 latent layout: 2x2 patchify into 128-feature tokens, and the latent normalization.

Feature order of a token (same as diffusers' `Flux2Pipeline._patchify_latents`):
`feature = channel * 4 + dy * 2 + dx` for the latent pixel at (2 * row + dy, 2 * col + dx).
Tokens of one image are row-major: `token = row * (w // 2) + col`.

The normalization is the only one in the project: FLUX.2 standardizes the *patchified*
128-channel latents with the VAE's BatchNorm running statistics
(`(z - running_mean) / sqrt(running_var + eps)`), exactly as diffusers' Flux2 pipeline does.
"""

from __future__ import annotations

import torch

PATCH = 2


def patchify_channels(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, 4C, h/2, w/2], feature = c * 4 + dy * 2 + dx."""
    b, c, h, w = latents.shape
    if h % PATCH or w % PATCH:
        raise ValueError(f"latent height and width must be even, got {h}x{w}")
    x = latents.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
    return x.permute(0, 1, 3, 5, 2, 4).reshape(b, c * PATCH * PATCH, h // PATCH, w // PATCH)


def unpatchify_channels(latents: torch.Tensor) -> torch.Tensor:
    """[B, 4C, h/2, w/2] -> [B, C, h, w]; the inverse of `patchify_channels`."""
    b, c4, hp, wp = latents.shape
    c = c4 // (PATCH * PATCH)
    x = latents.reshape(b, c, PATCH, PATCH, hp, wp)
    return x.permute(0, 1, 4, 2, 5, 3).reshape(b, c, hp * PATCH, wp * PATCH)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """One image's latents [C, h, w] (or [1, C, h, w]) -> tokens [h/2 * w/2, 4C], row-major."""
    if latents.dim() == 4:
        if latents.shape[0] != 1:
            raise ValueError("patchify takes one image; loop over the batch (sizes may differ)")
        latents = latents[0]
    x = patchify_channels(latents[None])[0]
    return x.flatten(1).transpose(0, 1)


def unpatchify(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Tokens [h/2 * w/2, 4C] -> latents [C, height, width] (height, width in latent pixels)."""
    hp, wp = height // PATCH, width // PATCH
    if tokens.shape[0] != hp * wp:
        raise ValueError(f"{tokens.shape[0]} tokens do not fill a {height}x{width} latent")
    x = tokens.transpose(0, 1).reshape(1, tokens.shape[1], hp, wp)
    return unpatchify_channels(x)[0]


def _stats(mean: torch.Tensor, var: torch.Tensor, eps: float, like: torch.Tensor):
    m = mean.view(1, -1, 1, 1).to(like.device, like.dtype)
    s = torch.sqrt(var.view(1, -1, 1, 1) + eps).to(like.device, like.dtype)
    return m, s


def normalize_latents(
    latents: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, eps: float
) -> torch.Tensor:
    """Raw VAE latents [B, C, h, w] -> normalized [B, C, h, w] (stats over the 4C patchified channels)."""
    x = patchify_channels(latents)
    m, s = _stats(mean, var, eps, x)
    return unpatchify_channels((x - m) / s)


def denormalize_latents(
    latents: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, eps: float
) -> torch.Tensor:
    """Normalized latents [B, C, h, w] -> raw VAE latents; the inverse of `normalize_latents`."""
    x = patchify_channels(latents)
    m, s = _stats(mean, var, eps, x)
    return unpatchify_channels(x * s + m)
