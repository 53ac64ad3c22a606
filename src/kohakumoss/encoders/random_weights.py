"""The real encoder architectures with random weights, for benchmarks: a Qwen3.5 text model, the FLUX.2 VAE.

Selected with TEXT_ENCODER='random' / VAE='random': they cost what the released encoders cost (the same
modules at the same sizes), but their weights are drawn from SEED and a caption becomes token ids by
hashing its words into the config's vocabulary (no tokenizer files). Sized by the DiT preset: the small
presets get the tiny configs, every other the Qwen3.5-9B and FLUX.2 ones. Never the default.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.models.qwen3_5 import Qwen3_5TextConfig, Qwen3_5TextModel
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from kohakumoss_common.hashing import sha256_json

from .text import QwenTextModelHolder
from .text_config import QWEN35_9B, tiny_text_encoder_config
from .text_template import MAX_TEXT_TOKENS
from .vae_config import FLUX2_VAE_CONFIG, tiny_vae_config, with_block_types

if TYPE_CHECKING:
    from .vae import ImageVAE

SMALL_PRESETS = ("tiny",)  # DiT presets whose text_dim is the tiny text model's width
SIZES = ("tiny", "full")


def random_size(preset: str) -> str:
    """'tiny' for a small DiT preset, else 'full' (Qwen3.5-9B, FLUX.2); '' (WEIGHTS given) is full."""
    return "tiny" if preset in SMALL_PRESETS else "full"


def random_text_config(size: str) -> Qwen3_5TextConfig:
    if size == "tiny":
        return tiny_text_encoder_config()
    if size == "full":
        return Qwen3_5TextConfig(**QWEN35_9B)
    raise ValueError(f"size '{size}' is not one of {SIZES}")


def random_vae_config(size: str) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"size '{size}' is not one of {SIZES}")
    return tiny_vae_config() if size == "tiny" else with_block_types(FLUX2_VAE_CONFIG)


def parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def random_encoder_bytes(kind: str, size: str, dtype: torch.dtype) -> int:
    """The parameter bytes the built 'text' or 'vae' encoder will hold in `dtype` (the architecture is
    instantiated on the meta device: nothing is allocated or drawn)."""
    if kind == "text":
        with torch.device("meta"):
            model = Qwen3_5TextModel(random_text_config(size))
    elif kind == "vae":
        from diffusers import AutoencoderKLFlux2

        with torch.device("meta"):
            model = AutoencoderKLFlux2.from_config(random_vae_config(size))
    else:
        raise ValueError(f"kind '{kind}' is not text or vae")
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


class RandomTextEncoder(QwenTextModelHolder):
    """A Qwen3.5 text model behind the trainer's encoder interface; captions -> word-hash token ids."""

    template = "{caption}"
    layer_choice = (-1,)

    def __init__(
        self, model: Qwen3_5TextModel, seed: int = 0, max_length: int = MAX_TEXT_TOKENS, drawn_on: str = "cpu"
    ):
        self.model = model.eval().requires_grad_(False)
        self.max_length = int(max_length)
        self.vocab_size = model.config.vocab_size
        config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_")}
        config.pop("transformers_version", None)
        config.pop("dtype", None)
        weights = [seed, str(self.dtype), drawn_on]  # the values differ per generator device
        self.identity = "random-text:" + sha256_json([config, weights, self.max_length, "word-hash"])[:16]

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def token_ids(self, caption: str) -> list[int]:
        """Each lower-cased word hashed into the vocabulary (an empty caption is one token)."""
        words = re.findall(r"\S+", caption.lower()) or [""]
        return [int(sha256_json(w)[:15], 16) % self.vocab_size for w in words][: self.max_length]

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (hidden [sum(lengths), hidden_size] packed, lengths [B]): one forward per caption,
        unpadded, as the real encoder runs them."""
        if isinstance(captions, str):
            raise TypeError("encode takes a list of captions, not one string")
        done: dict[str, torch.Tensor] = {}
        for caption in captions:
            if caption not in done:
                ids = torch.tensor([self.token_ids(caption)], dtype=torch.long, device=self.device)
                out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
                done[caption] = out.last_hidden_state[0]
        pieces = [done[c] for c in captions]
        lengths = torch.tensor([p.shape[0] for p in pieces], dtype=torch.long)
        if not pieces:
            return torch.zeros(0, self.hidden_size, dtype=self.dtype, device=self.device), lengths
        return torch.cat(pieces), lengths

    @torch.no_grad()
    def encode_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, N] of equal-length prompts -> packed hidden states [B * N, hidden] (one forward)."""
        out = self.model(input_ids=ids.to(self.device, non_blocking=True), use_cache=False)
        hidden = out.last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1])


def _pieces(model: nn.Module) -> Iterator[nn.Module]:
    """The model's children, a ModuleList's blocks one by one (each fits the draw device on its own)."""
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            yield from child
        else:
            yield child


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """The global generators of the CPU and `device` forked and seeded (transformers' init draws from them)."""
    if device.type == "cpu":
        fork = torch.random.fork_rng(devices=[])
    else:
        index = device.index if device.index is not None else torch.get_device_module(device).current_device()
        fork = torch.random.fork_rng(devices=[index], device_type=device.type)
    with fork:
        torch.manual_seed(int(seed))
        yield


def fill_text_model(model: Qwen3_5TextModel, seed: int, device: torch.device, draw: torch.device) -> None:
    """transformers' own init (`_init_weights`) of each piece in turn, drawn on `draw` from `seed` and kept on
    `device`: a GPU fills a host-kept 9B model in seconds, holding one piece at a time."""
    with seeded(seed, draw):
        for piece in _pieces(model):
            piece.to_empty(device=draw)
            piece.apply(model._init_weights)
            if draw != device:
                piece.to(device)
    # as the loader does: the rotary frequencies computed in float32 (the cast made them `dtype`)
    model.rotary_emb = Qwen3_5TextRotaryEmbedding(config=model.config).to(device)


def build_random_text_encoder(
    size: str,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    draw: torch.device | str | None = None,
    max_length: int = MAX_TEXT_TOKENS,
) -> RandomTextEncoder:
    """The `size` Qwen3.5 text model in `dtype` on `device`, its weights drawn on `draw` (default `device`)."""
    device = torch.device(device)
    with torch.device("meta"):  # no default init: fill_text_model draws every tensor
        model = Qwen3_5TextModel(random_text_config(size))
    model.to(dtype)
    draw = torch.device(draw) if draw is not None else device
    fill_text_model(model, seed, device, draw)
    return RandomTextEncoder(model, seed, max_length, drawn_on=draw.type)


def build_random_vae(size: str, seed: int, device: torch.device | str, dtype: torch.dtype) -> ImageVAE:
    """The `size` AutoencoderKLFlux2 with diffusers' default init from `seed` (drawn on the host)."""
    from .vae import ImageVAE

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return ImageVAE.from_config(random_vae_config(size), dtype=dtype, device=device)
