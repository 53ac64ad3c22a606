"""HostBatch: one step's inputs in host memory (pinned when a GPU is present), ready to copy over.

Edit / reference training (a dataset entry's `references` option, docs/guides/data.md): every sample
carries its clean reference images, in the dataset's order, as `references` (VAE latents, the same
[32, h/8, w/8] layout as `latents`) or `reference_pixels` (uint8 [3, h, w], when no image encoder is
given), with `reference_sizes` their (width, height) in pixels. Sample i's list is empty when it has no
reference; both fields stay None when no sample of the step has one (a text-to-image batch). Each
reference was resized to about its target's area at its own aspect (a multiple of 16 px per side) and
flipped with its target; it is never noised and takes no loss (the trainer's step decides how it enters
the model: after the text, at t = 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class HostBatch:
    step: int
    keys: list[str]
    captions: list[str]
    sizes: list[tuple[int, int]]  # target (width, height) in pixels, per image
    latents: list[torch.Tensor] | None = None  # [32, h/8, w/8] per image
    pixels: list[torch.Tensor] | None = None  # uint8 [3, h, w] per image, when no image encoder is given
    text_hidden: torch.Tensor | None = None  # packed [sum_len, D]
    text_lengths: torch.Tensor | None = None  # [B] long
    masks: list[torch.Tensor] | None = None  # float32 [h/16, w/16] per image (loss weight per image token)
    loss_weights: list[float] | None = None  # per image (its dataset's loss_weight); None: all 1
    # per sample, its reference latents in order: [32, h_m/8, w_m/8] each (sizes differ per reference)
    references: list[list[torch.Tensor]] | None = None
    reference_pixels: list[list[torch.Tensor]] | None = None  # uint8 [3, h_m, w_m], no image encoder
    reference_sizes: list[list[tuple[int, int]]] | None = None  # per sample, each reference's (w, h) px
    hits: dict[str, int] = field(default_factory=dict)  # cache hits per kind, for logging

    def token_weights(self) -> torch.Tensor | None:
        """float32 [image tokens] in the packed order (images in turn, each row-major): the mask of each
        image times its loss weight; None when every weight is 1 (the loss is then the plain mean)."""
        if self.masks is None and self.loss_weights is None:
            return None
        parts = []
        for i, (w, h) in enumerate(self.sizes):
            mask = self.masks[i] if self.masks is not None else torch.ones(h // 16, w // 16)
            weight = self.loss_weights[i] if self.loss_weights is not None else 1.0
            parts.append(mask.reshape(-1) * weight)
        return torch.cat(parts)

    @property
    def image_tokens(self) -> int:
        return sum((w // 16) * (h // 16) for w, h in self.sizes)

    @property
    def reference_tokens(self) -> list[int]:
        """Per sample, the tokens its references add to the sequence (16 px patches; 0 without any)."""
        if self.reference_sizes is None:
            return [0] * len(self.sizes)
        return [sum((w // 16) * (h // 16) for w, h in refs) for refs in self.reference_sizes]

    def pin_memory(self) -> HostBatch:
        """A copy whose tensors live in page-locked memory (only meaningful with CUDA)."""

        def pin(ts: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            return None if ts is None else [t.pin_memory() for t in ts]

        def pin_nested(ts: list[list[torch.Tensor]] | None) -> list[list[torch.Tensor]] | None:
            return None if ts is None else [[t.pin_memory() for t in refs] for refs in ts]

        return replace(
            self,
            latents=pin(self.latents),
            masks=pin(self.masks),
            pixels=pin(self.pixels),
            references=pin_nested(self.references),
            reference_pixels=pin_nested(self.reference_pixels),
            text_hidden=None if self.text_hidden is None else self.text_hidden.pin_memory(),
            text_lengths=None if self.text_lengths is None else self.text_lengths.pin_memory(),
        )
