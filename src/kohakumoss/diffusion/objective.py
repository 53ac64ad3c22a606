"""The flow-matching objective on packed image tokens: noisy input, velocity target, weighted loss.

x_t = (1 - sigma) x0 + sigma noise;  v = noise - x0;  loss = w(sigma) * rho(v_pred - v), where rho is the
squared error by default (LOSS_TYPE picks l1, huber or pseudo_huber) and w the LOSS_WEIGHTING.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kohakumoss_common.errors import ConfigError

WEIGHTINGS = ("none", "cosmap", "sigma_sqrt", "min_snr")
REDUCTIONS = ("token", "sample")
LOSS_TYPES = ("l2", "l1", "huber", "pseudo_huber")


@dataclass(frozen=True)
class LossConfig:
    """The loss settings' defaults: the functions below and the LOSS_* / HUBER_C / MIN_SNR_GAMMA knobs
    (config/train.py ObjectiveConfig) read them here."""

    weighting: str = "none"  # WEIGHTINGS
    reduction: str = "token"  # REDUCTIONS
    loss_type: str = "l2"  # LOSS_TYPES
    huber_c: float = 0.1
    min_snr_gamma: float = 5.0


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


def loss_weight(
    sigma: torch.Tensor, weighting: str, min_snr_gamma: float = LossConfig.min_snr_gamma
) -> torch.Tensor:
    """Per-sample weight of the velocity loss for LOSS_WEIGHTING.

    min_snr: min-SNR-gamma (Hang et al. 2023) moved onto the velocity loss. With SNR = ((1 - s) / s)^2 the
    x0 error is s * the velocity error, so the x0-space weight min(SNR, gamma) becomes
    s^2 * min(SNR, gamma) = min((1 - s)^2, gamma * s^2): the analogue of min(SNR, gamma) / (SNR + 1) for
    v-prediction, capping the weight of the low-noise, easy steps.
    """
    if weighting == "none":
        return torch.ones_like(sigma)
    if weighting == "cosmap":  # SD3's cosine-mapped weighting
        return 2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2))
    if weighting == "sigma_sqrt":
        return sigma.clamp_min(1e-4) ** -2.0
    if weighting == "min_snr":
        if min_snr_gamma <= 0:
            raise ConfigError("MIN_SNR_GAMMA", f"must be > 0, got {min_snr_gamma}")
        return torch.minimum((1 - sigma) ** 2, min_snr_gamma * sigma**2)
    raise ConfigError("LOSS_WEIGHTING", f"'{weighting}' is not one of {WEIGHTINGS}")


def token_error(
    pred: torch.Tensor,
    target: torch.Tensor,
    loss_type: str = LossConfig.loss_type,
    huber_c: float = LossConfig.huber_c,
) -> torch.Tensor:
    """Per-token mean over channels of rho(pred - target) [T].

    l2: d^2.  l1: |d|.  huber: d^2 for |d| <= c, 2c|d| - c^2 beyond (twice torch's huber_loss, so it equals
    l2 below c).  pseudo_huber: 2c (sqrt(d^2 + c^2) - c), the smooth form (kohya's 'huber'): ~d^2 near 0,
    ~2c|d| far out.  c is HUBER_C.
    """
    d = pred.float() - target.float()
    if loss_type == "l2":
        err = d.pow(2)
    elif loss_type == "l1":
        err = d.abs()
    elif loss_type in ("huber", "pseudo_huber"):
        if huber_c <= 0:
            raise ConfigError("HUBER_C", f"must be > 0, got {huber_c}")
        if loss_type == "huber":
            err = 2 * F.huber_loss(d, torch.zeros_like(d), reduction="none", delta=huber_c)
        else:
            err = 2 * huber_c * (torch.sqrt(d.pow(2) + huber_c**2) - huber_c)
    else:
        raise ConfigError("LOSS_TYPE", f"'{loss_type}' is not one of {LOSS_TYPES}")
    return err.mean(dim=-1)


def flow_matching_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    sigma: torch.Tensor,
    img_token_sample: torch.Tensor,
    weighting: str = LossConfig.weighting,
    reduction: str = LossConfig.reduction,
    *,
    loss_type: str = LossConfig.loss_type,
    huber_c: float = LossConfig.huber_c,
    min_snr_gamma: float = LossConfig.min_snr_gamma,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean velocity error (squared unless `loss_type` says otherwise); 'token' weighs every image token
    alike, 'sample' every sample alike. `weight` [T_img] scales each token's error before the mean (the
    data's loss mask times its dataset's loss_weight; kohya's convention: a masked-out token counts as 0
    in the mean, it is not dropped from it)."""
    if reduction not in REDUCTIONS:
        raise ConfigError("LOSS_REDUCTION", f"'{reduction}' is not one of {REDUCTIONS}")
    per_token = token_error(pred, target, loss_type, huber_c)
    w = loss_weight(sigma.to(per_token.device).float(), weighting, min_snr_gamma)[img_token_sample]
    if weight is not None:
        w = w * weight.float()
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
