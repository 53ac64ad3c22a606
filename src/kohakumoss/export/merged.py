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
from kohakumoss.model.io import hf_config_json, save_backbone
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss_common.errors import ConfigError

__all__ = ["hf_config_json", "save_merged", "save_state"]


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
        raise ConfigError("MERGED_LAYOUT", f"unknown layout '{layout}'; known: {sorted(LAYOUTS)}")
    return save_backbone(state, directory, layout, config, dtype, max_shard_bytes=max_shard_bytes)


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
    else:  # merged on the host, a linear at a time: a whole model's copy would not fit on the card
        state = merged_state_dict(model, source, multiplier, device="cpu")
    return save_state(state, model.config, directory, layout, dtype)
