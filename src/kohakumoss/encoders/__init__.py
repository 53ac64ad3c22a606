"""Text encoder (Qwen3.5) and image VAE (FLUX.2) wrappers, latent layout and normalization."""

from .latents import denormalize_latents, normalize_latents, patchify, unpatchify
from .text import TextEncoder
from .text_config import TextEncoderConfig, tiny_text_encoder_config
from .text_template import CHAT_TEMPLATE, MAX_TEXT_TOKENS
from .vae_config import tiny_vae_config

__all__ = [
    "CHAT_TEMPLATE",
    "MAX_TEXT_TOKENS",
    "ImageVAE",
    "TextEncoder",
    "TextEncoderConfig",
    "denormalize_latents",
    "normalize_latents",
    "patchify",
    "tiny_text_encoder_config",
    "tiny_vae_config",
    "unpatchify",
]


def __getattr__(name: str):
    if name == "ImageVAE":  # diffusers loads only where a VAE is used (latent-cached runs never import it)
        from .vae import ImageVAE

        return ImageVAE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
