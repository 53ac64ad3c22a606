"""Tiny stand-in encoders with the protocol of kohakumoss.encoders (no model, no hub)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FakeVAE:
    """8x average pooling, repeated to 32 channels; counts how many images it encoded."""

    def __init__(self, identity: str = "fake-vae-1"):
        self.identity = identity
        self.images_encoded = 0

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        assert pixels.dtype == torch.float32 and pixels.min() >= -1 and pixels.max() <= 1
        self.images_encoded += pixels.shape[0]
        pooled = F.avg_pool2d(pixels, 8)
        return pooled.repeat(1, 11, 1, 1)[:, :32].contiguous()


class FakeTextEncoder:
    """One hidden row per byte of the templated caption (at most 12), D = 16."""

    def __init__(self, identity: str = "fake-text-1", template: str = "{}", layer_choice: str = "-2"):
        self.identity = identity
        self.template = template
        self.layer_choice = layer_choice
        self.captions_encoded = 0

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        self.captions_encoded += len(captions)
        rows = []
        for caption in captions:
            data = self.template.format(caption).encode("utf-8")[:12] or b"\0"
            codes = torch.tensor(list(data), dtype=torch.float32)
            rows.append(codes[:, None] / 255.0 + torch.arange(16, dtype=torch.float32)[None, :])
        lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.long)
        return torch.cat(rows), lengths


def make_vae(identity: str = "fake-vae-1") -> FakeVAE:
    return FakeVAE(identity)


def make_text(
    identity: str = "fake-text-1", template: str = "{}", layer_choice: str = "-2"
) -> FakeTextEncoder:
    return FakeTextEncoder(identity, template, layer_choice)
