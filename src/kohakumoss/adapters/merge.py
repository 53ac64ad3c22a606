"""Merging an adapter into the base weights, through lycoris's modules.

The merge always goes through the saved form (`load_adapter` of the adapter's state dict), so what is
merged is exactly what the file holds; the live network and the model's weights are left untouched
(except by `merge_into`, which writes the merged weights into the model).

lycoris-lora 4.1.3's LoHa and LoKr apply alpha / rank twice in `get_diff_weight` (and so in
`get_merged_weight` / `merge_to`) while their forward applies it once; for those two the merged weight
is rebuilt from `get_weight` exactly as their forward does. Every other algorithm uses
`get_merged_weight`.
"""

from __future__ import annotations

import torch
from lycoris.modules.base import LycorisBaseModule
from lycoris.modules.loha import LohaModule
from lycoris.modules.lokr import LokrModule
from torch import nn

from .io import AdapterSource, load_adapter


def _merged(lora: LycorisBaseModule, multiplier: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = lora.org_module[0].weight
    if isinstance(lora, (LohaModule, LokrModule)):
        base = weight.float()
        diff = lora.get_weight(lora.shape).to(base) * lora.scalar.to(base)
        if lora.wd:
            return lora.apply_weight_decompose(base + diff, multiplier), None
        return base + diff * multiplier, None
    return lora.get_merged_weight(multiplier, weight.shape, weight.device)


@torch.no_grad()
def merged_weights(
    model: nn.Module, source: AdapterSource, multiplier: float = 1.0
) -> dict[str, torch.Tensor]:
    """{native key: merged tensor} for every weight (and bias) the adapter changes."""
    network = load_adapter(model, source, multiplier=1.0, apply=False)
    names = {id(m): n for n, m in model.named_modules()}
    out: dict[str, torch.Tensor] = {}
    for lora in network.loras:
        module = lora.org_module[0]
        lora.to(module.weight.device)
        lora.eval()
        w, b = _merged(lora, multiplier)
        key = names[id(module)]
        out[f"{key}.weight"] = w.detach().to(module.weight.dtype)
        if b is not None:
            out[f"{key}.bias"] = b.detach().to(module.weight.dtype)
    return out


@torch.no_grad()
def weight_diffs(model: nn.Module, source: AdapterSource, multiplier: float = 1.0) -> dict[str, torch.Tensor]:
    """{native key: merged - base} in float32, for exports that carry a full weight difference."""
    state = model.state_dict()
    return {k: v.float() - state[k].float() for k, v in merged_weights(model, source, multiplier).items()}


def merged_state_dict(
    model: nn.Module, source: AdapterSource, multiplier: float = 1.0
) -> dict[str, torch.Tensor]:
    """The model's full state dict with the adapter merged (unchanged tensors are shared, not copied)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    state.update(merged_weights(model, source, multiplier))
    return state


@torch.no_grad()
def merge_into(model: nn.Module, source: AdapterSource, multiplier: float = 1.0) -> nn.Module:
    """Write the merged weights into `model` (which must not carry the live network's forward)."""
    params = dict(model.named_parameters())
    for key, value in merged_weights(model, source, multiplier).items():
        params[key].copy_(value)
    return model
