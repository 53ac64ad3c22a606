"""What the data path needs from the encoders; the real ones live in `kohakumoss.encoders` and are passed in."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ImageEncoder(Protocol):
    """A VAE encoder: `identity` hashes its weights and config, so caches from another VAE never match."""

    identity: str

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B,3,H,W] floats in [-1,1] -> [B,32,H/8,W/8] normalized latents."""
        ...


@runtime_checkable
class TextEncoder(Protocol):
    """A caption encoder returning packed hidden states: (hidden [sum_len, D], lengths [B] long).

    `layer_choice` is any JSON-able value (a layer index, a tuple of them, a name).
    """

    identity: str
    layer_choice: object
    template: str

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]: ...
