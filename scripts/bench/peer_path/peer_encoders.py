"""Stand-in encoders for a peer trainer's own offline cache scripts (imported inside the peer's process).

KohakuMoss 0.1.0's `scripts/data/cache_text.py` / `cache_latents.py` take a dotted encoder factory
(TEXT_ENCODER / IMAGE_ENCODER); these factories return random embeddings of the real shapes, so the
peer's own cache writer fills its own vaults without the 9B text encoder or the VAE, as this project's
benchmark rows do with TEXT_ENCODER / VAE 'synthetic'. A caption is one token per word (the project's
synthetic text encoder counts the same way), so both trainers see the same text lengths. Each factory
reports the `encoder_spec` the peer's own spec function gives for the same arguments, so the peer's
trainer reads the entries. Imports only the peer's package (its import name is this project's: run it
with PYTHONPATH set to the peer's install folder and this folder).
"""

from __future__ import annotations

import re

import torch

TEXT_ID = "random-qwen3.5"  # TEXT_ENCODER_ID: a stand-in never writes under the real encoder's id
LATENT_ID = "random-flux2-vae"  # LATENT_ENCODER_ID


def random_text(path: str = "", device: str = "cuda", dtype=None, plan: dict | None = None,
                max_length: int = 4096, width: int = 4096, seed: int = 0):  # fmt: skip
    """An EncodeText callable: prompts -> one [words, width] bf16 embedding each (host tensors)."""
    from kohakumoss.encoders.text.factory import text_encoder_spec

    generator = torch.Generator().manual_seed(seed)

    def encode(prompts):
        return [
            torch.randn(max(1, len(re.findall(r"\S+", p))), width, generator=generator).to(torch.bfloat16)
            for p in prompts
        ]

    encode.encoder_id = TEXT_ID
    encode.encoder_spec = text_encoder_spec(path, device, dtype, plan, max_length)
    return encode


def random_latents(path: str = "", device: str = "cuda", dtype="auto", plan: dict | None = None,
                   channels: int = 128, seed: int = 0):  # fmt: skip
    """An EncodeImages callable: images + latent grids [B, 2] -> packed [sum h*w, channels] bf16 latents."""
    from kohakumoss.encoders.vae import vae_encoder_spec

    generator = torch.Generator().manual_seed(seed)

    def encode(images, grids):
        tokens = int(sum(int(h) * int(w) for h, w in grids.tolist()))
        return torch.randn(tokens, channels, generator=generator).to(torch.bfloat16)

    encode.encoder_id = LATENT_ID
    encode.encoder_spec = vae_encoder_spec(path, device, dtype)
    return encode
