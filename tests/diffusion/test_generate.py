"""Text to image end to end with the tiny text encoder, VAE and backbone: right sizes, seed-determinism."""

from __future__ import annotations

import numpy as np
import torch

from kohakumoss.diffusion import SamplerConfig
from kohakumoss.diffusion.generate import GenerationRequest, generate
from kohakumoss.encoders.tiny import load_tiny_text_encoder, tiny_vae
from kohakumoss.model import get_preset

from ..model.helpers import random_model


def test_generate_decodes_images_of_the_requested_size(tmp_path):
    cfg = get_preset("tiny")
    prompts = ["a red cat on a mat", "the quick brown fox"]
    text_encoder = load_tiny_text_encoder(tmp_path, prompts)
    assert text_encoder.hidden_size == cfg.text_dim
    vae, model = tiny_vae(), random_model(cfg)
    requests = [
        GenerationRequest(prompts[0], seed=1, width=64, height=48),
        GenerationRequest(prompts[1], seed=2, width=32, height=80),
    ]
    steps = []
    images = generate(
        model,
        text_encoder,
        vae,
        requests,
        SamplerConfig(steps=3, cfg_scale=3.0, uncond_skip_layers=(1,)),
        cfg.in_channels,
        progress=lambda i, n: steps.append(i),
    )
    assert [im.size for im in images] == [(64, 48), (32, 80)] and steps == [1, 2, 3]
    pixels = lambda im: torch.from_numpy(np.asarray(im, dtype=np.int16))  # noqa: E731
    sc = SamplerConfig(steps=3, cfg_scale=3.0, uncond_skip_layers=(1,))
    # the same request twice: bit-identical; alone instead of in a batch: equal up to float rounding
    once, twice = (generate(model, text_encoder, vae, requests[:1], sc, cfg.in_channels)[0] for _ in range(2))
    assert torch.equal(pixels(once), pixels(twice))
    assert (pixels(once) - pixels(images[0])).abs().max() <= 2
    other_seed = generate(
        model,
        text_encoder,
        vae,
        [GenerationRequest(prompts[0], seed=9, width=64, height=48)],
        sc,
        cfg.in_channels,
    )[0]
    assert (pixels(other_seed) - pixels(once)).abs().max() > 2
