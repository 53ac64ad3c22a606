"""Tiny random encoders built from config: a word-level tokenizer, a 4-block Qwen3.5 and a small VAE.

For tests and the embedded demo: nothing is downloaded, every file is written here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen3_5 import Qwen3_5TextModel
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

from kohakumoss_common.io import save_safetensors

from .text import TextEncoder
from .text_config import TextEncoderConfig, tiny_text_encoder_config
from .text_vision import IMAGE_PAD, VISION_END, VISION_START
from .vae import ImageVAE
from .vae_config import tiny_vae_config

SPECIALS = ("[PAD]", "[UNK]", "[EOS]", "<|im_start|>", "<|im_end|>")
CHAT_TAIL = ("assistant", "<think>", "</think>")  # the chat template's tokens, after the words (ids kept)
# Qwen3.5's chat template in miniature: ChatML turns; the generation prompt opens a think block when
# thinking is on (`<|im_start|>assistant\n<think>\n`) and closes an empty one when it is off.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
    "{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}"
)


VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)  # after the chat tail: earlier ids stay as they were
PICTURE_WORDS = ("picture", *(f"{n}:" for n in range(1, 9)))  # the `Picture N:` labels of references


def words_of(texts: Iterable[str]) -> list[str]:
    return sorted({w for t in texts for w in re.findall(r"\S+", t.lower())} | {"user"})


def write_word_tokenizer(folder: str | Path, texts: Iterable[str], vision: bool = False) -> Path:
    """A whitespace word-level tokenizer over the words of `texts`, saved as a fast tokenizer folder;
    vision: also the `Picture N:` words and Qwen's vision tokens (references in the prompt)."""
    folder = Path(folder)
    words = words_of([*texts, *(PICTURE_WORDS if vision else ())])
    tail = [t for t in CHAT_TAIL if t not in words]
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words, *tail, *(VISION_TOKENS if vision else ())])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import normalizers

    tok.normalizer = normalizers.Lowercase()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="[EOS]",
        additional_special_tokens=[
            "<|im_start|>",
            "<|im_end|>",
            *CHAT_TAIL[1:],
            *(VISION_TOKENS if vision else ()),
        ],
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return folder


def tiny_text_model(vocab: int, seed: int = 0) -> Qwen3_5TextModel:
    """A tiny Qwen3.5 text model with random weights for a tokenizer of `vocab` words."""
    torch.manual_seed(seed)
    model = Qwen3_5TextModel(tiny_text_encoder_config(vocab_size=max(vocab, 16))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # (1 + w) norms start at zero: give them some spread
                p.normal_(0, 0.2)
    return model


def tiny_vision_config(out_hidden_size: int = 32) -> Qwen3_5VisionConfig:
    """A one-block Qwen3.5 vision tower (patch 16, merge 2 as released), width 16."""
    return Qwen3_5VisionConfig(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=out_hidden_size,
        num_position_embeddings=16,
    )


def tiny_vision_model(out_hidden_size: int = 32, seed: int = 0) -> Qwen3_5VisionModel:
    """A tiny Qwen3.5 vision tower with random weights, its output as wide as the tiny text model."""
    torch.manual_seed(seed + 1)
    model = Qwen3_5VisionModel(tiny_vision_config(out_hidden_size)).eval()
    with torch.no_grad():  # transformers' init leaves some tensors at zero: every weight should matter
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def write_tiny_text_encoder(
    folder: str | Path, texts: Iterable[str], seed: int = 0, vision: bool = False
) -> TextEncoderConfig:
    """Write `folder/tokenizer` and `folder/model` (HF layout, random weights); return the config to load it.
    vision: the checkpoint holds a tiny vision tower (`model.visual.*`, as the released text_encoder/ does)."""
    folder = Path(folder)
    tokenizer = write_word_tokenizer(folder / "tokenizer", texts, vision=vision)
    vocab = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    model = tiny_text_model(vocab, seed)
    model_dir = folder / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "qwen3_5", "text_config": model.config.to_dict()}
    tensors = {f"model.language_model.{k}": v for k, v in model.state_dict().items()}
    if vision:
        tower = tiny_vision_model(model.config.hidden_size, seed)
        config["vision_config"] = tower.config.to_dict()
        tensors.update({f"model.visual.{k}": v for k, v in tower.state_dict().items()})
    (model_dir / "config.json").write_text(json.dumps(config))
    save_safetensors(tensors, model_dir / "model.safetensors")
    return TextEncoderConfig(path=str(model_dir), tokenizer_path=str(tokenizer), dtype="float32")


def load_tiny_text_encoder(
    folder: str | Path, texts: Iterable[str], seed: int = 0, vision: bool = False
) -> TextEncoder:
    """The tiny encoder; vision: with its tower, references in the prompt."""
    config = write_tiny_text_encoder(folder, texts, seed, vision)
    if vision:
        config = dataclasses.replace(config, reference_prompt="picture")
    return TextEncoder.load(config)


def tiny_vae(
    seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> ImageVAE:
    torch.manual_seed(seed)
    return ImageVAE.from_config(tiny_vae_config(), dtype=dtype, device=device)


def write_tiny_vae(folder: str | Path, seed: int = 0) -> Path:
    """A diffusers-layout folder (config.json + weights) of a tiny random FLUX.2-shaped VAE."""
    folder = Path(folder)
    tiny_vae(seed).model.save_pretrained(str(folder))
    return folder
