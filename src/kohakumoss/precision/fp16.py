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


def placed_scaled_step(optimizer, scaler: torch.amp.GradScaler, clip: float) -> torch.Tensor:
    """One update after a loss-scaled (fp16) backward when the optimizer's fp32 masters live off the GPU
    (`memory.engines.optimizer.PlacedOptimizer`, placements 'host' / 'stream'), where GradScaler cannot
    reach the grads it would unscale: the placed optimizer unscales its own (`unscale_`), a non-finite one
    skips the step, and the scale moves by GradScaler's own rule (torch._amp_update_scale_: back off on
    an overflow, grow after `growth_interval` clean steps). Returns the grad norm (NaN when skipped)."""
    scale = scaler.get_scale()
    bad = optimizer.unscale_(1.0 / scale)
    norm = torch.tensor(float("nan"))
    if not bad:
        norm = optimizer.clip_grad_norm_(clip)
        optimizer.step()
    found = torch.full((), float(bad), device=scaler._scale.device)
    torch._amp_update_scale_(
        scaler._scale,
        scaler._growth_tracker,
        found,
        scaler.get_growth_factor(),
        scaler.get_backoff_factor(),
        scaler.get_growth_interval(),
    )
    return norm
