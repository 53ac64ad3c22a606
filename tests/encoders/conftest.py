"""Tiny Qwen3.5 text encoders and FLUX.2 VAEs written to tmp folders (no hub, ever)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers.models.qwen3_5 import Qwen3_5TextModel

from kohakumoss.encoders import (
    ImageVAE,
    TextEncoder,
    TextEncoderConfig,
    tiny_text_encoder_config,
    tiny_vae_config,
)
from kohakumoss.encoders.tiny import write_word_tokenizer
from kohakumoss_common.io import save_safetensors

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

WORDS = [
    "a",
    "red",
    "cat",
    "sits",
    "on",
    "the",
    "mat",
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "user",
    "assistant",
]
SPECIALS = ["[PAD]", "[UNK]", "[EOS]", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "<|im_start|>user {caption}<|im_end|>"  # a literal template (the default is the chat template)
TOKENIZER = ""  # set per test by the `_tokenizer` fixtures


def load_text_encoder(path, **kw) -> TextEncoder:
    """A float32 TextEncoder with the test tokenizer (and its chat template) unless told otherwise."""
    kw.setdefault("tokenizer_path", TOKENIZER)
    kw.setdefault("dtype", "float32")
    return TextEncoder.load(TextEncoderConfig(path=str(path), **kw))


def make_tokenizer(folder: Path) -> Path:
    return write_word_tokenizer(folder, WORDS)


def random_text_model(seed: int = 0) -> Qwen3_5TextModel:
    torch.manual_seed(seed)
    model = Qwen3_5TextModel(tiny_text_encoder_config(vocab_size=64)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # zero-initialised (1 + w) norms: make them matter
                p.normal_(0, 0.2)
    return model


def write_hf_folder(folder: Path, model: Qwen3_5TextModel, prefix: str = "model.language_model.") -> Path:
    """An HF-layout Qwen3.5 folder; its tokenizer lives apart, since AutoTokenizer would pick the real
    Qwen3.5 tokenizer class for a folder whose config.json says qwen3_5."""
    folder.mkdir(parents=True, exist_ok=True)
    text_config = model.config.to_dict()
    config = {"model_type": "qwen3_5", "text_config": text_config}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {prefix + k: v for k, v in model.state_dict().items()}
    tensors["lm_head.weight"] = torch.zeros(64, 32)
    save_safetensors(tensors, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="session")
def text_model() -> Qwen3_5TextModel:
    return random_text_model()


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory, text_model) -> Path:
    """A Qwen3_5ForConditionalGeneration-style folder (keys under model.language_model.)."""
    return write_hf_folder(tmp_path_factory.mktemp("qwen") / "hf", text_model)


@pytest.fixture(scope="session")
def tokenizer_folder(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def random_vae(small_decoder: bool = False, seed: int = 0) -> ImageVAE:
    torch.manual_seed(seed)
    vae = ImageVAE.from_config(tiny_vae_config(small_decoder=small_decoder))
    vae.model.bn.running_mean.normal_()
    vae.model.bn.running_var.uniform_(0.5, 2.0)
    return vae


@pytest.fixture(scope="session")
def vae() -> ImageVAE:
    return random_vae()
