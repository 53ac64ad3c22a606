"""Text-encoder settings (`TextEncoderConfig`) and Qwen3.5 model configs: preset, tiny, inferred.

The Qwen3.5-9B preset follows the public model card and transformers' defaults ("Qwen3.5-9B style");
it was not checked against the released config.json. Inference from shapes fixes every size; the
key/value head split of the linear-attention layers and the RoPE settings are not visible in shapes
and come from the preset (key head dim = value head dim; override when a checkpoint differs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.models.qwen3_5 import Qwen3_5TextConfig

from kohakumoss_common.errors import CheckpointError, ConfigError

from .text_template import CHAT_TEMPLATE, MAX_TEXT_TOKENS, check_template
from .text_vision import REFERENCE_MAX_PIXELS, REFERENCE_PROMPTS

COMBINE = ("mean", "concat")
TEXT_QUANTS = ("none", "fp8", "fp8_weight", "int8", "int8_weight")  # text_quant.py's modes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

QWEN35_9B: dict[str, Any] = {
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
}
PRESETS = {"qwen3.5-9b": QWEN35_9B}


@dataclass
class TextEncoderConfig:
    """How captions become packed hidden states.

    path: HF folder (config.json + safetensors + tokenizer) or one ComfyUI-style safetensors file.
    tokenizer_path: tokenizer folder (defaults to `path` when that is a folder).
    layers: hidden-state index or indices, HF convention: 0 = embeddings, k = output of block k,
        -1 = the final normed output (`last_hidden_state`, what MOSS-Image reads), -2 = the output of
        the second-to-last block.
    combine: how several layers merge: "mean" (width D) or "concat" (width D * len(layers)).
    template: "chat" (the released one: the tokenizer's chat template, generation prompt, thinking on),
        or a literal text with one "{caption}" placeholder (no str.format escaping). Every token of
        the templated prompt is returned.
    max_length: most tokens of the templated prompt kept (truncated on the right, as released: 4096).
    preset: model config for a single file ("qwen3.5-9b"); None infers it from the tensor shapes.
    layout: "auto", "hf" or "comfy" key names.
    prune_unused_layers: do not load or run blocks after the deepest layer asked for.
    model_overrides: Qwen3.5 config fields set on top of the preset or inferred config (for a single
        file: what shapes cannot tell, e.g. `rope_parameters`, `rms_norm_eps`).
    quant: the decoder blocks' linears: "none" (dtype), "fp8" / "int8" (stored and multiplied in 8 bits),
        "fp8_weight" / "int8_weight" (stored in 8 bits, dequantized per call); an int8 file's (ConvRot
        included) int8 bytes are kept as stored in the int8 modes (`text_quant.py`).
    reference_prompt: "picture" loads the checkpoint's vision tower and puts the reference images an
        `encode` call is given before the caption (`Picture N:`, text_vision.py); "none" leaves them out.
    reference_max_pixels: each reference's size for the vision tower (downscaled, never upscaled).
    """

    path: str
    tokenizer_path: str | None = None
    layers: int | list[int] | tuple[int, ...] = -1
    combine: str = "mean"
    template: str = CHAT_TEMPLATE
    max_length: int = MAX_TEXT_TOKENS
    dtype: str = "bfloat16"
    device: str = "cpu"
    preset: str | None = None
    layout: str = "auto"
    prune_unused_layers: bool = True
    model_overrides: dict[str, Any] | None = None
    quant: str = "none"
    reference_prompt: str = "none"
    reference_max_pixels: int = REFERENCE_MAX_PIXELS

    def __post_init__(self) -> None:
        self.layers = (self.layers,) if isinstance(self.layers, int) else tuple(self.layers)
        if not self.layers or not all(isinstance(i, int) for i in self.layers):
            raise ConfigError("text_encoder.layers", f"need one int or a list of ints, got {self.layers!r}")
        if self.combine not in COMBINE:
            raise ConfigError("text_encoder.combine", f"{self.combine!r} is not one of {COMBINE}")
        check_template(self.template)
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ConfigError(
                "text_encoder.max_length", f"must be a whole number >= 1, got {self.max_length!r}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError("text_encoder.dtype", f"{self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError("text_encoder.preset", f"{self.preset!r} is not one of {sorted(PRESETS)}")
        if self.layout not in ("auto", "hf", "comfy"):
            raise ConfigError("text_encoder.layout", f"{self.layout!r} is not auto, hf or comfy")
        if self.quant not in TEXT_QUANTS:
            raise ConfigError("text_encoder.quant", f"{self.quant!r} is not one of {TEXT_QUANTS}")
        if self.reference_prompt not in REFERENCE_PROMPTS:
            raise ConfigError(
                "text_encoder.reference_prompt",
                f"{self.reference_prompt!r} is not one of {REFERENCE_PROMPTS}",
            )
        bad_pixels = isinstance(self.reference_max_pixels, bool) or not isinstance(
            self.reference_max_pixels, int
        )
        if bad_pixels or self.reference_max_pixels < 1024:
            raise ConfigError(
                "text_encoder.reference_max_pixels",
                f"must be a whole number >= 1024, got {self.reference_max_pixels!r}",
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def with_overrides(config: Qwen3_5TextConfig, overrides: dict[str, Any] | None) -> Qwen3_5TextConfig:
    """`config` with some fields replaced (a new config; unknown fields raise a ConfigError)."""
    if not overrides:
        return config
    raw = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "transformers_version")}
    unknown = sorted(set(overrides) - set(raw))
    if unknown:
        raise ConfigError("text_encoder.model_overrides", f"unknown Qwen3.5 config fields {unknown}")
    return Qwen3_5TextConfig(**{**raw, **overrides})


def tiny_text_encoder_config(vocab_size: int = 64) -> Qwen3_5TextConfig:
    """A four-block Qwen3.5 (three Gated DeltaNet blocks, one full-attention block), width 32."""
    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=4096,
    )


def folder_text_config(path: Path) -> Qwen3_5TextConfig | None:
    """The text config of an HF folder (a `qwen3_5` config's `text_config`, or a `qwen3_5_text` one)."""
    file = path / "config.json"
    if not path.is_dir() or not file.exists():
        return None
    raw = json.loads(file.read_text())
    raw = raw.get("text_config", raw)
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    return Qwen3_5TextConfig(**raw)


def _shape(shapes: dict[str, tuple[int, ...]], key: str, path: object) -> tuple[int, ...]:
    if key not in shapes:
        raise CheckpointError(path, f"cannot infer the Qwen3.5 config: key {key} is missing")
    return shapes[key]


def _layer_types(shapes: dict[str, tuple[int, ...]], n: int, path: object) -> list[str]:
    types = []
    for i in range(n):
        if f"layers.{i}.linear_attn.A_log" in shapes:
            types.append("linear_attention")
        elif f"layers.{i}.self_attn.q_proj.weight" in shapes:
            types.append("full_attention")
        else:
            raise CheckpointError(path, f"block {i} has neither linear_attn nor self_attn weights")
    return types


def infer_text_config(
    shapes: dict[str, tuple[int, ...]], path: object = "<checkpoint>", base: dict[str, Any] | None = None
) -> Qwen3_5TextConfig:
    """A Qwen3.5 text config from `Qwen3_5TextModel`-named shapes; what shapes cannot tell comes from `base`."""
    vocab, hidden = _shape(shapes, "embed_tokens.weight", path)
    n = len({int(m[1]) for k in shapes if (m := re.match(r"^layers\.(\d+)\.", k))})
    types = _layer_types(shapes, n, path)
    fields: dict[str, Any] = {**(base or QWEN35_9B), "vocab_size": vocab, "hidden_size": hidden}
    fields.update(num_hidden_layers=n, layer_types=types)
    fields["intermediate_size"] = _shape(shapes, "layers.0.mlp.gate_proj.weight", path)[0]
    if "full_attention" in types:
        i = types.index("full_attention")
        head_dim = _shape(shapes, f"layers.{i}.self_attn.q_norm.weight", path)[0]
        q_rows = _shape(shapes, f"layers.{i}.self_attn.q_proj.weight", path)[0]
        kv_rows = _shape(shapes, f"layers.{i}.self_attn.k_proj.weight", path)[0]
        fields.update(head_dim=head_dim, num_attention_heads=q_rows // (2 * head_dim))
        fields["num_key_value_heads"] = kv_rows // head_dim
    if "linear_attention" in types:
        i = types.index("linear_attention")
        v_heads = _shape(shapes, f"layers.{i}.linear_attn.A_log", path)[0]
        v_dim = _shape(shapes, f"layers.{i}.linear_attn.norm.weight", path)[0]
        qkv_rows = _shape(shapes, f"layers.{i}.linear_attn.in_proj_qkv.weight", path)[0]
        conv = _shape(shapes, f"layers.{i}.linear_attn.conv1d.weight", path)
        key_total = (qkv_rows - v_heads * v_dim) // 2
        fields.update(linear_num_value_heads=v_heads, linear_value_head_dim=v_dim)
        fields.update(linear_key_head_dim=v_dim, linear_num_key_heads=key_total // v_dim)
        fields["linear_conv_kernel_dim"] = conv[-1]
    return Qwen3_5TextConfig(**fields)


def truncated(config: Qwen3_5TextConfig, num_layers: int) -> Qwen3_5TextConfig:
    """The same config with only its first `num_layers` blocks."""
    raw = config.to_dict()
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
    raw.update(num_hidden_layers=num_layers, layer_types=list(config.layer_types[:num_layers]))
    return Qwen3_5TextConfig(**raw)
