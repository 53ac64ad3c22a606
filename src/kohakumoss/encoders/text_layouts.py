"""Qwen3.5 text-encoder key names -> `transformers` `Qwen3_5TextModel` names. Every key name lives here.

HF layout (checked against transformers' own Qwen3.5 classes): `language_model.*` (Qwen3_5Model: the
released MOSS-Image `text_encoder/`, which also carries the vision tower `visual.*`),
`model.language_model.*` (Qwen3_5ForConditionalGeneration), `model.*` (Qwen3_5ForCausalLM) or bare
(Qwen3_5TextModel); the vision tower, `lm_head` and the multi-token-prediction head are skipped.

ComfyUI layout: built from public descriptions of ComfyUI's Qwen text-encoder files (HF module names
under `model.`, optionally inside a `text_encoders.<name>.transformer.` or `transformer.` wrapper);
NOT verified against the real ComfyUI Qwen3.5 file.
"""

from __future__ import annotations

import re

HF_PREFIXES = ("model.language_model.", "language_model.", "model.")
COMFY_WRAPPERS = (r"^text_encoders\.[^.]+\.transformer\.", r"^transformer\.")
SKIPPED = (r"^(model\.)?visual\.", r"^lm_head\.", r"^mtp\.", r"^model\.mtp\.")
TEXT_ROOTS = ("embed_tokens.", "layers.", "norm.")


def _strip_hf(key: str) -> str | None:
    if any(re.match(p, key) for p in SKIPPED):
        return None
    for prefix in HF_PREFIXES:
        if key.startswith(prefix) and key[len(prefix) :].startswith(TEXT_ROOTS):
            return key[len(prefix) :]
    return key


def hf_key(key: str) -> str | None:
    """An HF checkpoint key -> the `Qwen3_5TextModel` key, or None when it is not part of the text model."""
    return _strip_hf(key)


def comfy_key(key: str) -> str | None:
    """A ComfyUI text-encoder key -> the `Qwen3_5TextModel` key, or None when it is skipped."""
    for wrapper in COMFY_WRAPPERS:
        key = re.sub(wrapper, "", key)
    return _strip_hf(key)


def detect_layout(keys: list[str]) -> str:
    """'comfy' when a ComfyUI wrapper prefix or quantization marker is present, else 'hf'."""
    comfy = any(re.match(w, k) for w in COMFY_WRAPPERS for k in keys)
    comfy = comfy or any(k.endswith((".comfy_quant", ".weight_scale", ".scale_weight")) for k in keys)
    return "comfy" if comfy else "hf"


def text_key(layout: str, key: str) -> str | None:
    return comfy_key(key) if layout == "comfy" else hf_key(key)


def model_to_comfy(key: str) -> str:
    """A `Qwen3_5TextModel` key -> the ComfyUI file key (export and tests)."""
    return f"model.{key}"
