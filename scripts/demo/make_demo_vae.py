"""Train the demo's tiny FLUX.2-shaped VAE on the demo pictures, so its decoder really reconstructs.

    kogine run scripts/demo/make_demo_vae.py        (about 10 to 15 minutes on 2 CPU cores)

A random VAE decodes to noise, which would hide what the demo LoRA learned; this short training on
random crops of assets/demo/images gives a small autoencoder for these colours and textures only. The
result is committed as assets/demo/vae/ (diffusers layout, fp16); the BatchNorm statistics that
normalize the latents are set from the data at the end.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGES = "assets/demo/images"
OUT = "assets/demo/vae"
STEPS = 1500
BATCH = 6
CROP = 48
LR = 2e-3
KL_WEIGHT = 1e-6
SEED = 0


def load_images(folder: str) -> list[torch.Tensor]:
    paths = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in (".jpg", ".png"))
    return [
        torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1).float() / 127.5 - 1
        for p in paths
    ]


def random_crops(images: list[torch.Tensor], n: int, size: int, rng: random.Random) -> torch.Tensor:
    out = []
    for _ in range(n):
        im = rng.choice(images)
        y, x = rng.randrange(im.shape[1] - size + 1), rng.randrange(im.shape[2] - size + 1)
        crop = im[:, y : y + size, x : x + size]
        out.append(crop.flip(-1) if rng.random() < 0.5 else crop)
    return torch.stack(out)


def main() -> None:
    from kohakumoss.encoders.latents import patchify_channels
    from kohakumoss.encoders.tiny import tiny_vae

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    images = load_images(IMAGES)
    vae = tiny_vae(SEED)
    model = vae.model.train().requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for step in range(STEPS):
        x = random_crops(images, BATCH, CROP, rng)
        posterior = model.encode(x).latent_dist
        recon = model.decode(posterior.sample()).sample
        loss = (recon - x).pow(2).mean() + KL_WEIGHT * posterior.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        for g in opt.param_groups:
            g["lr"] = LR * 0.5 * (1 + np.cos(np.pi * (step + 1) / STEPS))
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step:4d}  mse {(recon - x).pow(2).mean().item():.4f}")
    model.eval()
    with torch.no_grad():  # latent normalization statistics from the data (per patchified channel)
        feats = [patchify_channels(model.encode(im[None]).latent_dist.mode()) for im in images]
        flat = torch.cat([f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]) for f in feats])
        model.bn.running_mean.copy_(flat.mean(0))
        model.bn.running_var.copy_(flat.var(0))
        recon = [model.decode(model.encode(im[None]).latent_dist.mode()).sample[0] for im in images]
        psnr = [(10 * torch.log10(4 / (r - im).pow(2).mean())).item() for r, im in zip(recon, images)]
    print("reconstruction PSNR per demo image (dB):", [round(p, 1) for p in psnr])
    model.to(torch.float16).save_pretrained(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
