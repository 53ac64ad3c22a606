"""Merged transformer exports: base + adapter (through lycoris) in the native, comfy or hf key layout."""

from __future__ import annotations

from pathlib import Path

import torch

from kohakumoss.adapters.io import AdapterSource
from kohakumoss.adapters.merge import merged_state_dict
from kohakumoss.model import MossBackbone
from kohakumoss.model.io import save_backbone


def save_merged(
    model: MossBackbone,
    source: AdapterSource | None,
    directory: str | Path,
    layout: str = "native",
    dtype: torch.dtype | None = torch.bfloat16,
    multiplier: float = 1.0,
) -> list[Path]:
    """Write the merged backbone (or the model as is when `source` is None, e.g. a full fine-tune)."""
    if source is None:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    else:
        state = merged_state_dict(model, source, multiplier)
    return save_backbone(state, directory, layout=layout, config=model.config, dtype=dtype)
