"""The flow-matching objective on packed image tokens: noisy input, velocity target, weighted loss.

x_t = (1 - sigma) x0 + sigma noise;  v = noise - x0;  loss = w(sigma) * |v_pred - v|^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kohakumoss_common.errors import ConfigError

WEIGHTINGS = ("none", "cosmap", "sigma_sqrt")
REDUCTIONS = ("token", "sample")


@dataclass(frozen=True)
class FlowTarget:
    x_t: torch.Tensor  # [T_img, C] noisy tokens, the backbone's image input
    target: torch.Tensor  # [T_img, C] velocity
    sigma: torch.Tensor  # [B]


def make_flow_target(
    x0: torch.Tensor, sigma: torch.Tensor, img_token_sample: torch.Tensor, noise: torch.Tensor
) -> FlowTarget:
    """x0 [T_img, C] clean latent tokens; sigma [B]; noise like x0."""
    s = sigma.to(x0.device, torch.float32)[img_token_sample][:, None]
    x_t = ((1 - s) * x0.float() + s * noise.float()).to(x0.dtype)
    return FlowTarget(x_t=x_t, target=(noise.float() - x0.float()), sigma=sigma)


def loss_weight(sigma: torch.Tensor, weighting: str) -> torch.Tensor:
    if weighting == "none":
        return torch.ones_like(sigma)
    if weighting == "cosmap":  # SD3's cosine-mapped weighting
        return 2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2))
    if weighting == "sigma_sqrt":
        return sigma.clamp_min(1e-4) ** -2.0
    raise ConfigError("LOSS_WEIGHTING", f"'{weighting}' is not one of {WEIGHTINGS}")


def flow_matching_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    sigma: torch.Tensor,
    img_token_sample: torch.Tensor,
    weighting: str = "none",
    reduction: str = "token",
) -> torch.Tensor:
    """Mean squared velocity error; 'token' weighs every image token alike, 'sample' every sample alike."""
    if reduction not in REDUCTIONS:
        raise ConfigError("LOSS_REDUCTION", f"'{reduction}' is not one of {REDUCTIONS}")
    per_token = (pred.float() - target.float()).pow(2).mean(dim=-1)
    w = loss_weight(sigma.to(per_token.device).float(), weighting)[img_token_sample]
    per_token = per_token * w
    if reduction == "token":
        return per_token.mean()
    return _per_sample_mean(per_token, img_token_sample, sigma.shape[0]).mean()


def per_sample_loss(
    pred: torch.Tensor, target: torch.Tensor, img_token_sample: torch.Tensor, n: int
) -> torch.Tensor:
    """Unweighted mean squared error per sample [n] (validation at fixed sigmas)."""
    per_token = (pred.float() - target.float()).pow(2).mean(dim=-1)
    return _per_sample_mean(per_token, img_token_sample, n)


def _per_sample_mean(per_token: torch.Tensor, token_sample: torch.Tensor, n: int) -> torch.Tensor:
    """[n] means of per_token over each sample's tokens; counts by index_add (bincount waits on the GPU)."""
    sums = per_token.new_zeros(n).index_add_(0, token_sample, per_token)
    counts = per_token.new_zeros(n).index_add_(0, token_sample, torch.ones_like(per_token))
    return sums / counts.clamp_min(1)
