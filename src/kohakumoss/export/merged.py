"""Merged transformer exports in the released layouts: base + adapter (through lycoris), or the model
as is (a full fine-tune).

hf / native   the HF `transformer/` folder: `diffusion_pytorch_model.safetensors` (sharded with an index
              above 5 GiB) under the released names (= MossBackbone's), and `config.json` with the
              released fields (`MossConfig.hf_config`) and class name.
comfy         one `moss_image.safetensors` for ComfyUI's diffusion_models/: the same names with each
              block's q, k, v fused into `layers.N.proj.qkv`, keys under `model.diffusion_model.`.
Every file also carries the full MossConfig and the layout name in its metadata.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kohakumoss.adapters.io import AdapterSource
from kohakumoss.adapters.merge import merged_state_dict
from kohakumoss.model import MossBackbone, MossConfig
from kohakumoss.model.io import CONFIG_METADATA_KEY, LAYOUT_METADATA_KEY
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.io import atomic_write_json, save_safetensors, save_sharded

from .comfy_keys import fuse_qkv

HF_CLASS_NAME = "MOSSImageTransformer"  # transformer/config.json `_class_name` of the release
HF_PREFIX = "diffusion_pytorch_model"
COMFY_FILE = "moss_image.safetensors"
COMFY_SAVE_PREFIX = "model.diffusion_model."  # what ComfyUI's own checkpoint saver writes
LAYOUTS = ("hf", "native", "comfy")


def hf_config_json(config: MossConfig) -> dict:
    """The released transformer/config.json for `config`."""
    return {"_class_name": HF_CLASS_NAME, **config.hf_config()}


def save_state(
    state: dict[str, torch.Tensor],
    config: MossConfig,
    directory: str | Path,
    layout: str = "hf",
    dtype: torch.dtype | None = torch.bfloat16,
    max_shard_bytes: int = 5 << 30,
) -> list[Path]:
    """Write a full native state dict in `layout` (see the module docstring); returns the files."""
    if layout not in LAYOUTS:
        raise ConfigError("MERGED_LAYOUT", f"unknown layout '{layout}'; known: {list(LAYOUTS)}")
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    directory = Path(directory)
    name = "hf" if layout == "native" else layout  # one layout under two names
    metadata = {CONFIG_METADATA_KEY: config.to_json(), LAYOUT_METADATA_KEY: name, "format": "pt"}
    if layout == "comfy":
        fused = {COMFY_SAVE_PREFIX + k: v for k, v in fuse_qkv(state).items()}
        path = directory / COMFY_FILE
        save_safetensors(fused, path, metadata)  # one file: ComfyUI loads a single file
        return [path]
    paths = save_sharded(state, directory, HF_PREFIX, max_shard_bytes, metadata)
    atomic_write_json(directory / "config.json", hf_config_json(config))
    return paths


def save_merged(
    model: MossBackbone,
    source: AdapterSource | None,
    directory: str | Path,
    layout: str = "hf",
    dtype: torch.dtype | None = torch.bfloat16,
    multiplier: float = 1.0,
) -> list[Path]:
    """Write the merged backbone (or the model as is when `source` is None, e.g. a full fine-tune)."""
    if source is None:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    else:
        state = merged_state_dict(model, source, multiplier)
    return save_state(state, model.config, directory, layout, dtype)
