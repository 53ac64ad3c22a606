"""Latent layout and normalization: exact round trips, and bit-equal to diffusers' Flux2 pipeline."""

from __future__ import annotations

import torch
from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

from kohakumoss.encoders.latents import (
    denormalize_latents,
    normalize_latents,
    patchify,
    patchify_channels,
    unpatchify,
)


def test_patchify_round_trip_exact():
    z = torch.randn(32, 6, 10)
    tokens = patchify(z)
    assert tokens.shape == (15, 128)
    assert torch.equal(unpatchify(tokens, 6, 10), z)


def test_patchify_feature_order():
    z = torch.randn(32, 4, 6)
    tokens = patchify(z)
    row, col, c, dy, dx = 1, 2, 5, 1, 0
    assert tokens[row * 3 + col, c * 4 + dy * 2 + dx] == z[c, 2 * row + dy, 2 * col + dx]


def test_patchify_matches_diffusers_pack():
    z = torch.randn(1, 32, 8, 12)
    want = Flux2Pipeline._pack_latents(Flux2Pipeline._patchify_latents(z))[0]
    assert torch.equal(patchify(z), want)
    assert torch.equal(patchify_channels(z), Flux2Pipeline._patchify_latents(z))


def _stats():
    torch.manual_seed(0)
    return torch.randn(128), torch.rand(128) + 0.5, 1e-4


def test_normalize_matches_diffusers_pipeline():
    mean, var, eps = _stats()
    z = torch.randn(2, 32, 8, 6)
    p = Flux2Pipeline._patchify_latents(z)
    want = (p - mean.view(1, -1, 1, 1)) / torch.sqrt(var.view(1, -1, 1, 1) + eps)
    assert torch.equal(patchify_channels(normalize_latents(z, mean, var, eps)), want)
    back = Flux2Pipeline._unpatchify_latents(
        want * torch.sqrt(var.view(1, -1, 1, 1) + eps) + mean.view(1, -1, 1, 1)
    )
    assert torch.equal(denormalize_latents(normalize_latents(z, mean, var, eps), mean, var, eps), back)


def test_normalization_round_trip():
    mean, var, eps = _stats()
    z = torch.randn(2, 32, 8, 6)
    torch.testing.assert_close(denormalize_latents(normalize_latents(z, mean, var, eps), mean, var, eps), z)
    # with power-of-two scales the round trip is bit-exact
    var = torch.full((128,), 4.0 - eps)
    zero = torch.zeros(128)
    assert torch.equal(denormalize_latents(normalize_latents(z, zero, var, eps), zero, var, eps), z)
