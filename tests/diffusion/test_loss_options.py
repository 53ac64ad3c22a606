"""Loss options against their plain formulas: LOSS_TYPE (l1, huber, pseudo_huber), the min-SNR weighting
for flow matching and SD3's mode sampling of sigma."""

from __future__ import annotations

import math

import pytest
import torch

from kohakumoss.diffusion import TimestepConfig, draw_sigmas, flow_matching_loss
from kohakumoss.diffusion.objective import LOSS_TYPES, loss_weight, token_error
from kohakumoss.diffusion.timestep import MODE_SCALE_RANGE
from kohakumoss_common.errors import ConfigError


def _plain(d: float, loss_type: str, c: float) -> float:
    """One element's error, written out from the definitions."""
    if loss_type == "l2":
        return d * d
    if loss_type == "l1":
        return abs(d)
    if loss_type == "huber":
        return d * d if abs(d) <= c else 2 * c * abs(d) - c * c
    return 2 * c * (math.sqrt(d * d + c * c) - c)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_token_error_matches_the_plain_formula(loss_type):
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    c = 0.3
    got = token_error(pred, target, loss_type, c)
    d = (pred - target).tolist()
    want = torch.tensor([sum(_plain(x, loss_type, c) for x in row) / len(row) for row in d])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_huber_kinds_agree_with_l2_near_zero_and_grow_linearly_far_out():
    small, big = torch.full((1, 4), 1e-3), torch.full((1, 4), 10.0)
    zero = torch.zeros(1, 4)
    for kind in ("huber", "pseudo_huber"):
        assert token_error(small, zero, kind, 0.1).item() == pytest.approx(1e-6, rel=1e-3)
        # slope 2c far from zero: much less than l2's 100
        assert token_error(big, zero, kind, 0.1).item() == pytest.approx(2 * 0.1 * 10 - 0.01, rel=1e-2)


def test_loss_type_reaches_flow_matching_loss_with_weights_and_reductions():
    pred = torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    target = torch.zeros(3, 2)
    ts = torch.tensor([0, 1, 1])
    sigma = torch.tensor([0.25, 0.5])
    got = flow_matching_loss(pred, target, sigma, ts, "min_snr", "sample", loss_type="l1", min_snr_gamma=1.0)
    w = [min(0.75**2, 0.25**2), min(0.5**2, 0.5**2)]
    per_sample = [w[0] * 1.0, w[1] * (0.0 + 1.0) / 2]
    assert got.item() == pytest.approx(sum(per_sample) / 2)
    # the default is the plain mean squared error
    assert flow_matching_loss(pred, target, sigma, ts).item() == pytest.approx((2 + 0 + 1) / 3)


def test_min_snr_weight_is_sigma_squared_times_capped_snr():
    sigma = torch.tensor([0.01, 0.1, 0.3, 0.5, 0.9, 0.99], dtype=torch.float64)
    for gamma in (1.0, 5.0):
        snr = ((1 - sigma) / sigma) ** 2
        want = sigma**2 * torch.clamp(snr, max=gamma)
        torch.testing.assert_close(loss_weight(sigma, "min_snr", gamma), want)
    # gamma caps only the low-noise end: at high noise the weight is (1 - sigma)^2
    assert loss_weight(torch.tensor([0.9]), "min_snr", 5.0).item() == pytest.approx(0.01)


def test_mode_sampling_follows_sd3_f_mode():
    s = 1.29
    n = 40000
    sig = draw_sigmas(TimestepConfig(mode="mode", mode_scale=s, shift="none"), torch.full((n,), 256), None)
    assert sig.min() > 0 and sig.max() < 1

    def f(u):
        return 1 - u - s * (math.cos(math.pi * u / 2) ** 2 - 1 + u)

    # f is decreasing: P(sigma <= f(u0)) = 1 - u0
    for u0 in (0.1, 0.3, 0.5, 0.8):
        frac = (sig <= f(u0)).double().mean().item()
        assert frac == pytest.approx(1 - u0, abs=0.01)
    # s > 0 favours the middle: more mass in [0.25, 0.75] than uniform's half
    assert ((sig > 0.25) & (sig < 0.75)).double().mean().item() > 0.6
    # s = 0 is uniform
    u = draw_sigmas(TimestepConfig(mode="mode", mode_scale=0.0, shift="none"), torch.full((n,), 256), None)
    assert abs(((u > 0.25) & (u < 0.75)).double().mean().item() - 0.5) < 0.015


def test_bad_loss_knobs_name_themselves():
    x, ts, sigma = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.ones(1) * 0.5
    with pytest.raises(ConfigError, match="LOSS_TYPE"):
        flow_matching_loss(x, x, sigma, ts, loss_type="l3")
    with pytest.raises(ConfigError, match="HUBER_C"):
        flow_matching_loss(x, x, sigma, ts, loss_type="huber", huber_c=0.0)
    with pytest.raises(ConfigError, match="MIN_SNR_GAMMA"):
        flow_matching_loss(x, x, sigma, ts, "min_snr", min_snr_gamma=-1.0)
    with pytest.raises(ConfigError, match="MODE_SCALE"):
        TimestepConfig(mode="mode", mode_scale=MODE_SCALE_RANGE[1] + 0.01)
