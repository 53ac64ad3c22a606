"""A learning check beyond a falling loss: after training, samples drawn from the training captions are
closer to the training images than the base model's samples are.

Metric: mean squared error, in the VAE's normalized latent space, between the latent sampled for each
training caption (20 Euler steps of the released sampler at shift 1, no guidance, seed 0) and that
caption's training-image latent. Measured while writing this test (LoRA r16, 200 steps, LR 2e-3, tiny
preset, 64 px wallpaper crops): base 1.180, trained 1.069 (9% lower); with the released sampler, noise
and chat-templated prompts, 150 steps as the test runs: base 1.177, trained 1.054 (10% lower). The
test trains 150 steps and asks for at least 5% lower.
Latent space, because the tiny random VAE's decoder is not a trained decoder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from kohakumoss.config.train import TrainConfig
from kohakumoss.diffusion import SamplerConfig
from kohakumoss.diffusion.generate import GenerationRequest, generate_latents
from kohakumoss.export.from_checkpoint import attach
from kohakumoss.train.components import build_backbone, build_text_encoder, build_vae
from kohakumoss.train.loop import train

from .conftest import PICKS, SIZE, tiny_knobs


def latent_distance(model, text_encoder, targets: list[torch.Tensor]) -> float:
    requests = [GenerationRequest(c, 0, SIZE, SIZE) for c in PICKS.values()]
    config = SamplerConfig(steps=20, cfg_scale=1.0, shift=1.0)
    latents = generate_latents(model, text_encoder, requests, config, model.config.in_channels)
    return float(np.mean([((lat - t) ** 2).mean().item() for lat, t in zip(latents, targets)]))


def test_lora_samples_move_toward_the_training_images(train_world):
    k = tiny_knobs(
        train_world,
        "learning",
        STEPS=150,
        LR=2e-3,
        RANK=16,
        ALPHA=16.0,
        TOKENS_PER_STEP=4 * 32,
        TIMESTEP_SHIFT="none",
    )
    run = train(k)
    cpu = torch.device("cpu")
    cfg = TrainConfig.from_knobs(k)
    base = build_backbone(cfg.model, cpu, torch.float32, fp32_masters=False, seed=cfg.run.seed)
    encoders, precision, seed = cfg.encoders, cfg.device.precision, cfg.run.seed
    text_encoder = build_text_encoder(
        encoders,
        cpu,
        base.config.text_dim,
        precision=precision,
        seed=seed,
        max_length=cfg.data.max_text_tokens,
    )
    vae = build_vae(encoders, cpu, precision=precision, seed=seed)
    folder = Path(k["DATASET"]["path"]) / "2_style"
    targets = []
    for name in PICKS:
        pixels = np.asarray(Image.open(folder / f"{name.split('.')[0]}.png").convert("RGB"))
        targets.append(vae.encode(torch.from_numpy(pixels).permute(2, 0, 1).float()[None] / 127.5 - 1)[0])
    before = latent_distance(base, text_encoder, targets)
    trained = build_backbone(cfg.model, cpu, torch.float32, fp32_masters=False, seed=cfg.run.seed)
    attach(trained, run / "checkpoints" / "step_00000150")
    after = latent_distance(trained, text_encoder, targets)
    print(f"latent MSE to the training images: base {before:.3f}, trained {after:.3f}")
    assert after < 0.95 * before, (before, after)
