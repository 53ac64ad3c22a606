"""`TextEncoder`: Qwen3.5 (transformers' `qwen3_5`, text part) -> packed prompt hidden states.

`encode(captions) -> (hidden [sum_len, D'], lengths [B])`, one row per token of the templated prompt
(template tokens included), samples one after another. As the released pipeline: one prompt per
forward, unpadded (no padding ever enters the Gated DeltaNet state), `last_hidden_state` by default.
A caption that occurs more than once in a call is encoded once. With `reference_prompt='picture'` the
checkpoint's vision tower is loaded too, and `encode(captions, references)` puts each caption's
reference images before it (`Picture N:`, text_vision.py); the rows then include the vision tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer
from transformers.models.qwen3_5 import Qwen3_5TextConfig, Qwen3_5TextModel
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.hashing import sha256_json
from kohakumoss_common.io import foreign_weights, iter_tensors, read_header, resolve_files
from kohakumoss_common.log import get_logger
from kohakumoss_common.quant import QuantPlan, dequantize, plan_quantization

from . import text_layouts, text_quant
from .identity import files_identity, module_identity
from .streaming import cast, check_keys, expected_shapes, meta_leftovers, set_tensor
from .text_config import (
    PRESETS,
    TextEncoderConfig,
    folder_text_config,
    infer_text_config,
    truncated,
    with_overrides,
)
from .text_template import PromptTokenizer
from .text_vision import (
    IMAGE_PAD,
    ReferenceImage,
    VisionTower,
    image_digest,
    load_vision_tower,
    reference_prefix,
    vision_tower_problem,
)
from .tokenizer_folder import TOKENIZER_MARKERS, find_tokenizer

log = get_logger(__name__)
TOKENIZER_FILES = (
    "tokenizer*.json",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "*.model",
    "chat_template*",
)


def resolve_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """Hidden-state indices (HF convention, 0..num_layers) with negatives resolved."""
    out = tuple(i if i >= 0 else num_layers + 1 + i for i in layers)
    bad = [i for i, r in zip(layers, out) if not 0 <= r <= num_layers]
    if bad:
        raise ConfigError("text_encoder.layers", f"{bad} out of range for a {num_layers}-block model")
    return out


class _Capture:
    """Forward hooks that keep the hidden states at the chosen indices during one forward."""

    def __init__(self, model: Qwen3_5TextModel, indices: tuple[int, ...], full_layers: int):
        self.states: dict[int, torch.Tensor] = {}
        self.handles = []
        for index in set(indices):
            module = self._module(model, index, full_layers)
            self.handles.append(module.register_forward_hook(self._hook(index)))

    @staticmethod
    def _module(model: Qwen3_5TextModel, index: int, full_layers: int) -> nn.Module:
        if index == 0:
            return model.embed_tokens
        return model.norm if index == full_layers else model.layers[index - 1]

    def _hook(self, index: int):
        def hook(_module, _inputs, output):
            self.states[index] = output[0] if isinstance(output, tuple) else output

        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class QwenTextModelHolder:
    """Where a wrapped Qwen3.5 text model (`self.model`) lives: its device and dtype."""

    model: nn.Module

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype


class TextEncoder(QwenTextModelHolder):
    """Qwen3.5 text encoder with a fixed template and layer choice."""

    def __init__(
        self,
        model: Qwen3_5TextModel,
        tokenizer,
        config: TextEncoderConfig,
        full_config: Qwen3_5TextConfig,
        weights_identity: str | None = None,
        tokenizer_identity: str = "unknown",
        vision: VisionTower | None = None,
    ):
        if config.reference_prompt == "picture" and vision is None:
            raise ConfigError(
                "text_encoder.reference_prompt",
                "'picture' needs the checkpoint's vision tower, none was given",
            )
        self.model = model.eval().requires_grad_(False)
        self.config = config
        self.full_config = full_config
        self.layer_indices = resolve_layers(config.layers, full_config.num_hidden_layers)
        deepest = max(self.layer_indices)
        if deepest > len(model.layers) and deepest != full_config.num_hidden_layers:
            raise ConfigError("text_encoder.layers", f"layer {deepest} was pruned from the loaded model")
        self.prompts = PromptTokenizer(tokenizer, config.template, config.max_length)
        self.vision = vision if config.reference_prompt == "picture" else None
        self._multimodal = self.vision.multimodal(model, model.config) if self.vision is not None else None
        if weights_identity is None:
            weights_identity = module_identity(model)
            if self.vision is not None:
                weights_identity += module_identity(self.vision.model)
        self._weights_identity = weights_identity
        self._tokenizer_identity = tokenizer_identity

    @classmethod
    def load(cls, config: TextEncoderConfig) -> TextEncoder:
        """Load weights (HF folder or single file, streamed per tensor) and the tokenizer."""
        path = Path(config.path)
        files = resolve_files(path)
        tok_path = _tokenizer_path(path, config)
        tokenizer = _load_tokenizer(tok_path)
        tok_files = sorted({f for pattern in TOKENIZER_FILES for f in tok_path.glob(pattern) if f.is_file()})
        if config.reference_prompt == "picture" and (problem := vision_tower_problem(path)):
            raise ConfigError("text_encoder.reference_prompt", problem)  # before any weight is read
        model, full = _load_model(path, config)
        vision = _load_vision(path, config, tokenizer) if config.reference_prompt == "picture" else None
        identity = files_identity(files)
        return cls(model, tokenizer, config, full, identity, files_identity(tok_files), vision)

    @property
    def references_in_prompt(self) -> bool:
        """Whether `encode` puts reference images before the caption (their images then key the cache)."""
        return self.vision is not None

    @property
    def layer_choice(self) -> tuple[int, ...]:
        return self.config.layers

    @property
    def template(self) -> str:
        return self.config.template

    @property
    def hidden_size(self) -> int:
        """Width of the returned hidden states."""
        width = self.full_config.hidden_size
        return width * len(self.layer_indices) if self.config.combine == "concat" else width

    @property
    def identity(self) -> str:
        """sha256 of model config, weights, tokenizer, template, layer choice and dtype: a cache key."""
        model_config = {k: v for k, v in self.full_config.to_dict().items() if not k.startswith("_")}
        model_config.pop("transformers_version", None)
        model_config.pop("dtype", None)
        return sha256_json(
            {
                "model": model_config,
                "weights": self._weights_identity,
                "tokenizer": self._tokenizer_identity,
                "template": self.config.template,
                "prompt": "whole templated prompt, one per forward",
                "layers": self.layer_indices,
                "combine": self.config.combine,
                "max_length": self.config.max_length,
                "dtype": str(self.dtype),
                **({"quant": self.config.quant} if self.config.quant != "none" else {}),
                **({"references": self.vision.settings} if self.vision is not None else {}),
            }
        )

    def to(self, device: str | torch.device) -> TextEncoder:
        self.model.to(device)
        if self.vision is not None:
            self.vision.model.to(device)
        return self

    def tokenize(self, captions: list[str]) -> list[list[int]]:
        return [self.prompts(c) for c in captions]

    @torch.no_grad()
    def encode(
        self, captions: list[str], references: Sequence[Sequence[ReferenceImage]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (hidden [sum(lengths), hidden_size] packed in caption order, lengths [B] long).

        references: per caption, its reference images (PIL, or uint8 [3, H, W]); put before the caption
        when `references_in_prompt`, else not read (the ComfyUI Moss-Image-Edit format)."""
        if isinstance(captions, str):
            raise TypeError("encode takes a list of captions, not one string")
        captions = list(captions)
        refs = [()] * len(captions) if references is None or self.vision is None else list(references)
        if len(refs) != len(captions):
            raise ValueError(f"{len(captions)} captions but {len(refs)} reference lists")
        done: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        keys = [(c, tuple(image_digest(im) for im in r)) for c, r in zip(captions, refs)]
        for key, images in zip(keys, refs):
            if key not in done:
                done[key] = (
                    self._with_references(key[0], images) if images else self._forward(self.prompts(key[0]))
                )
        pieces = [done[k] for k in keys]
        lengths = torch.tensor([p.shape[0] for p in pieces], dtype=torch.long)
        if not pieces:
            return torch.zeros(0, self.hidden_size, dtype=self.dtype, device=self.device), lengths
        return torch.cat(pieces), lengths

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """One prompt's hidden states [len(ids), hidden_size]."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        capture = _Capture(self.model, self.layer_indices, self.full_config.num_hidden_layers)
        try:
            self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False)
        finally:
            capture.close()
        return self._combine([capture.states[i] for i in self.layer_indices])[0]

    def reference_span(self, sizes: Sequence[tuple[int, int]]) -> int:
        """Tokens a prompt needs up to its last reference's vision tokens, for references of these
        (width, height): over `max_length` the encoder refuses the prompt (images not read)."""
        if self.vision is None or not sizes:
            return 0
        counts = [self.vision.token_count(w, h) for w, h in sizes]
        ids = self.prompts.tokenizer(self.prompts.format(reference_prefix(counts)), truncation=False)[
            "input_ids"
        ]
        pad = self.vision.token_ids[IMAGE_PAD]
        return max(i for i, t in enumerate(ids) if t == pad) + 1

    def reference_prompt_tokens(self, sizes: Sequence[tuple[int, int]]) -> int:
        """Tokens the `Picture N:` prefix of references of these (width, height) adds to a prompt (its
        vision tokens included); 0 when the prompt shows no references. The plan budgets them."""
        if self.vision is None or not sizes:
            return 0
        counts = [self.vision.token_count(w, h) for w, h in sizes]
        tokenize = self.prompts.tokenizer
        shown = tokenize(self.prompts.format(reference_prefix(counts)), truncation=False)["input_ids"]
        return len(shown) - len(tokenize(self.prompts.format(""), truncation=False)["input_ids"])

    def _with_references(self, caption: str, images: Sequence[ReferenceImage]) -> torch.Tensor:
        """One prompt with its references before the caption: hidden states [len, hidden_size]."""
        pixel_values, grid, counts = self.vision.prepare(images)
        text = self.prompts.format(reference_prefix(counts) + caption)
        ids = self.prompts.tokenizer(text, truncation=False)["input_ids"]
        pad = self.vision.token_ids[IMAGE_PAD]
        last_vision = max(i for i, t in enumerate(ids) if t == pad)
        if last_vision >= self.config.max_length:  # right truncation may cut the caption, never a picture
            raise ConfigError(
                "text_encoder.max_length",
                f"{len(images)} reference images take {last_vision + 1} tokens of the prompt, over the "
                f"{self.config.max_length}-token cap (MAX_TEXT_TOKENS): raise it, or use fewer / smaller references",
            )
        input_ids = torch.tensor([ids[: self.config.max_length]], dtype=torch.long, device=self.device)
        capture = _Capture(self.model, self.layer_indices, self.full_config.num_hidden_layers)
        try:
            self._multimodal(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                pixel_values=pixel_values.to(self.device),
                image_grid_thw=grid.to(self.device),
                mm_token_type_ids=(input_ids == pad).int(),
                use_cache=False,
            )
        finally:
            capture.close()
        return self._combine([capture.states[i] for i in self.layer_indices])[0]

    def _combine(self, states: list[torch.Tensor]) -> torch.Tensor:
        if len(states) == 1:
            return states[0]
        if self.config.combine == "concat":
            return torch.cat(states, dim=-1)
        return torch.stack([s.float() for s in states]).mean(0).to(states[0].dtype)


def load_prompt_tokenizer(config: TextEncoderConfig) -> PromptTokenizer:
    """The encoder's prompt tokenizer alone (no weights read): to count a prompt's tokens before loading."""
    tokenizer = _load_tokenizer(_tokenizer_path(Path(config.path), config))
    return PromptTokenizer(tokenizer, config.template, config.max_length)


def _tokenizer_path(path: Path, config: TextEncoderConfig) -> Path:
    if config.tokenizer_path is not None:
        return Path(config.tokenizer_path)
    if path.is_dir() and any((path / marker).exists() for marker in TOKENIZER_MARKERS):
        return path
    # a Comfy-Org file, or an HF snapshot's text_encoder/, holds no tokenizer: the one beside it
    # (kohakumoss-config's rule: text_encoders/<...>/tokenizer, the snapshot's tokenizer/)
    found = find_tokenizer(path.parent)
    if found is not None:
        log.info("tokenizer: %s (found beside %s)", found, path.name)
        return found
    if path.is_dir():
        return path
    raise ConfigError(
        "text_encoder.tokenizer_path",
        f"{path} is a single file and no tokenizer folder (holding tokenizer.json) is under {path.parent}; "
        "give the tokenizer folder (TOKENIZER)",
    )


def _load_tokenizer(path: Path):
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError("text_encoder.tokenizer_path", f"{path}: no usable tokenizer ({e})") from e


def _load_vision(path: Path, config: TextEncoderConfig, tokenizer) -> VisionTower:
    header, metadata = read_header(path)
    quant = plan_quantization(path, header, rotations=True, packed=True, metadata=metadata)
    tower = load_vision_tower(
        path, header, quant, tokenizer, config.torch_dtype, config.device, config.reference_max_pixels
    )
    log.info(
        "vision tower loaded from %s (%d blocks): references go into the prompt", path, tower.config.depth
    )
    return tower


def _model_config(path: Path, config: TextEncoderConfig, shapes: dict) -> Qwen3_5TextConfig:
    base = folder_text_config(path)
    if base is None and config.preset is not None:
        base = Qwen3_5TextConfig(**PRESETS[config.preset])
    if base is None:
        base = infer_text_config(shapes, path)
    return with_overrides(base, config.model_overrides)


def _load_model(path: Path, config: TextEncoderConfig) -> tuple[Qwen3_5TextModel, Qwen3_5TextConfig]:
    text_quant.check_device(config.quant, config.device)  # before any weight is read
    header, metadata = read_header(path)
    # ConvRot files are un-rotated as they stream; ComfyUI W4A8 codes are decoded (`QuantPlan.stored`)
    quant = plan_quantization(path, header, rotations=True, packed=True, metadata=metadata)
    keys = [k for k in header if k not in quant.dropped]
    layout = text_layouts.detect_layout(list(header)) if config.layout == "auto" else config.layout
    names = {k: n for k in keys if (n := text_layouts.text_key(layout, k)) is not None}
    shapes = {n: tuple(quant.shape(k, header[k][1])) for k, n in names.items()}
    if not any(n.startswith("layers.") for n in shapes):
        raise foreign_weights(path, "a text encoder (a Qwen3.5 language model's layers.*)", header)
    full = _model_config(path, config, shapes)
    keep = _kept_layers(config, full)
    names = {k: n for k, n in names.items() if not _pruned(n, keep)}
    shapes = {n: s for n, s in shapes.items() if not _pruned(n, keep)}
    with torch.device("meta"):
        model = Qwen3_5TextModel(truncated(full, keep) if keep < full.num_hidden_layers else full)
    check_keys(path, expected_shapes(model), shapes)
    _stream(model, path, names, quant, config)
    model.rotary_emb = Qwen3_5TextRotaryEmbedding(config=model.config).to(config.device)
    if left := meta_leftovers(model):
        raise CheckpointError(path, f"nothing loaded these tensors: {left}")
    if config.quant != "none":
        n = text_quant.quantize_text_linears(model, config.quant, config.device)
        log.info("text encoder: %d block linears stored as %s", n, config.quant)
    log.info(
        "text encoder loaded from %s (%s layout, %d of %d blocks)", path, layout, keep, full.num_hidden_layers
    )
    return model, full


def _kept_layers(config: TextEncoderConfig, full: Qwen3_5TextConfig) -> int:
    n = full.num_hidden_layers
    deepest = max(resolve_layers(config.layers, n))
    return max(deepest, 1) if config.prune_unused_layers and deepest < n else n


def _pruned(name: str, keep: int) -> bool:
    parts = name.split(".")
    return parts[0] == "layers" and int(parts[1]) >= keep


def _stream(model: nn.Module, path: Path, names: dict[str, str], quant: QuantPlan, config) -> None:
    scales = quant.scales
    scale_values = dict(iter_tensors(path, keys=set(scales.values()))) if scales else {}
    for key, tensor in iter_tensors(path, keys=set(names)):
        if key in scales:  # int8 / fp8 as stored, W4A8 as its int8 grid; ConvRot group or 0
            data, scale, group = quant.stored(key, tensor, scale_values[scales[key]])
            if data.dtype == torch.int8 and text_quant.keep_stored_int8(
                model, names[key], data, scale, group, config.quant, config.device, config.torch_dtype
            ):
                continue
            tensor = dequantize(data, scale, config.torch_dtype, group)
        set_tensor(model, names[key], cast(tensor, config.torch_dtype, config.device))
