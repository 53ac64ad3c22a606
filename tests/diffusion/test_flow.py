"""Flow matching for training: sigma sampling and shifts, targets, loss reductions (sampler: test_sampler.py)."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.diffusion import TimestepConfig, draw_sigmas, flow_matching_loss, make_flow_target
from kohakumoss.diffusion.timestep import shift_sigma
from kohakumoss_common.errors import ConfigError


def test_uniform_and_logit_normal_sigma_statistics():
    g = torch.Generator().manual_seed(0)
    tokens = torch.full((20000,), 256)
    u = draw_sigmas(TimestepConfig(mode="uniform", shift="none"), tokens, g)
    assert abs(u.mean().item() - 0.5) < 0.01 and u.min() > 0 and u.max() < 1
    ln = draw_sigmas(
        TimestepConfig(mode="logit_normal", logit_mean=1.0, logit_std=0.5, shift="none"), tokens, g
    )
    logit = torch.log(ln / (1 - ln))
    assert abs(logit.mean().item() - 1.0) < 0.02 and abs(logit.std().item() - 0.5) < 0.02


def test_resolution_shift_grows_with_tokens_and_is_identity_at_mu_zero():
    cfg = TimestepConfig(mode="uniform", shift="resolution")
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    small = draw_sigmas(cfg, torch.full((5000,), 256), g1)
    large = draw_sigmas(cfg, torch.full((5000,), 4096), g2)
    assert large.mean() > small.mean() + 0.05
    s = torch.rand(100)
    assert torch.allclose(shift_sigma(s, 1.0), s)


def test_draw_sigmas_is_deterministic_given_generator():
    cfg = TimestepConfig()
    a = draw_sigmas(cfg, torch.tensor([256, 1024, 4096]), torch.Generator().manual_seed(7))
    b = draw_sigmas(cfg, torch.tensor([256, 1024, 4096]), torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_bad_knobs_name_themselves():
    with pytest.raises(ConfigError, match="TIMESTEP_SAMPLING"):
        TimestepConfig(mode="cosine")
    with pytest.raises(ConfigError, match="LOSS_WEIGHTING"):
        flow_matching_loss(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(1), torch.zeros(2, dtype=torch.long), "x"
        )


def test_flow_target_endpoints_and_velocity():
    x0, noise = torch.randn(6, 4), torch.randn(6, 4)
    ts = torch.tensor([0, 0, 0, 1, 1, 1])
    ft = make_flow_target(x0, torch.tensor([0.0, 1.0]), ts, noise)
    assert torch.allclose(ft.x_t[:3], x0[:3]) and torch.allclose(ft.x_t[3:], noise[3:])
    assert torch.allclose(ft.target, noise - x0)
    # integrating the true velocity from sigma=1 to 0 recovers x0 exactly
    assert torch.allclose(noise - 1.0 * ft.target, x0, atol=1e-6)


def test_loss_token_vs_sample_reduction():
    pred, target = torch.zeros(4, 2), torch.tensor([[1.0, 1.0], [0, 0], [0, 0], [0, 0]])
    ts = torch.tensor([0, 1, 1, 1])
    sigma = torch.tensor([0.5, 0.5])
    assert flow_matching_loss(pred, target, sigma, ts, reduction="token").item() == pytest.approx(0.25)
    assert flow_matching_loss(pred, target, sigma, ts, reduction="sample").item() == pytest.approx(0.5)
    w = flow_matching_loss(pred, target, sigma, ts, weighting="cosmap").item()
    assert w == pytest.approx(0.25 * 2 / (torch.pi * 0.5))
