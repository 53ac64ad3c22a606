"""Validation loss on held-out items at fixed sigmas and fixed noise: a number that does not jitter."""

from __future__ import annotations

import torch

from kohakumoss.diffusion.objective import make_flow_target, per_sample_loss

from .step import DeviceBatch, step_generator


@torch.no_grad()
def validation_loss(
    model, batches: list[DeviceBatch], sigmas: list[float], dtype: torch.dtype, seed: int
) -> float:
    """Mean unweighted velocity error over every held-out sample and every fixed sigma."""
    if not batches:
        return float("nan")
    total, count = 0.0, 0
    for b, batch in enumerate(batches):
        noise = torch.randn(batch.x0.shape, generator=step_generator(seed, 10_000_000 + b, 1)).to(batch.x0)
        for s in sigmas:
            sigma = torch.full((batch.num_samples,), float(s), device=batch.x0.device)
            target = make_flow_target(batch.x0, sigma, batch.seq.img_token_sample, noise)
            with torch.autocast(batch.x0.device.type, dtype=dtype, enabled=dtype != torch.float32):
                refs = {} if batch.refs is None else {"refs": batch.refs}
                pred = model(target.x_t, batch.text, sigma, batch.seq, **refs)
            losses = per_sample_loss(pred, target.target, batch.seq.img_token_sample, batch.num_samples)
            total, count = total + losses.sum().item(), count + batch.num_samples
    return total / count
