"""Synthetic encoders for benchmarks and smoke runs of the full-size model where no weights exist.

They follow the real encoders' interfaces (identity, encode) and are deterministic, but they are not
models: the text "encoder" maps each word to a fixed random vector, the "VAE" is a fixed random
projection of 8x8 pixel patches. Selected with TEXT_ENCODER='synthetic' / VAE='synthetic'; never the
default, and the run log says so.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from kohakumoss_common.hashing import sha256_json


class SyntheticTextEncoder:
    template = "{caption}"
    layer_choice = (-1,)

    def __init__(self, hidden_size: int, seed: int = 0, device: str | torch.device = "cpu"):
        self.hidden_size, self.seed, self.device = hidden_size, seed, torch.device(device)
        self.identity = "synthetic-text:" + sha256_json([hidden_size, seed])[:16]

    def _word(self, word: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(sha256_json([self.seed, word])[:15], 16))
        return torch.randn(self.hidden_size, generator=g)

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [[self._word(w) for w in re.findall(r"\S+", c.lower())] or [self._word("")] for c in captions]
        hidden = torch.stack([v for r in rows for v in r])
        return hidden.to(self.device), torch.tensor([len(r) for r in rows], dtype=torch.long)


class SyntheticVAE:
    latent_channels = 32

    def __init__(self, seed: int = 0, device: str | torch.device = "cpu"):
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.proj = (torch.randn(self.latent_channels, 3 * 64, generator=g) / 8.0).to(self.device)
        self.identity = "synthetic-vae:" + sha256_json([seed])[:16]

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] -> [B, 32, H/8, W/8]."""
        patches = F.pixel_unshuffle(pixels.to(self.device, torch.float32), 8)  # [B, 192, H/8, W/8]
        return torch.einsum("oc,bchw->bohw", self.proj, patches)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Least-squares inverse of the projection (only for smoke-test sample grids)."""
        inv = torch.linalg.pinv(self.proj)
        patches = torch.einsum("co,bohw->bchw", inv, latents.to(self.device, torch.float32))
        return F.pixel_shuffle(patches, 8).clamp(-1, 1)
