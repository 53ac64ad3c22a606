"""PRECISION fp16 (cards without bf16: sm70 / sm75): the DiT's residual streams kept in float32.

In fp16 the residual stream x (x += gate * branch, block after block) may outgrow fp16's range
(65504) while every branch input stays small (each branch reads rms_norm(x), and the linears then run in
fp16 under autocast). `fp32_residuals` sets `MossBackbone.residual_dtype` to float32: the gated-residual
ops already add in float32, and now also store the sum in float32; the modulated norms read it and
write their output in float32, which autocast casts to fp16 for the linears. Cost: the stream's
activations at 4 bytes instead of 2 (the branch activations stay fp16), one cast per linear input.
"""

from __future__ import annotations

import torch
from torch import nn


def fp32_residuals(model: nn.Module, enabled: bool = True) -> None:
    """Keep `model`'s (a MossBackbone's) residual streams in float32 (enabled) or in the embedders'
    dtype (not)."""
    model.residual_dtype = torch.float32 if enabled else None


def wants_fp32_residuals(precision: str) -> bool:
    """Whether a run at PRECISION `precision` keeps float32 residual streams: fp16 only (bf16 has fp32's
    range; fp32 has nothing to keep)."""
    return precision == "fp16"
