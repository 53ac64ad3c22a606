"""Merging an adapter into the base weights, through lycoris's modules.

The merge always goes through the saved form (`load_adapter` of the adapter's state dict), so what is
merged is exactly what the file holds; the live network and the model's weights are left untouched
(except by `merge_into`, which writes the merged weights into the model).

lycoris-lora 4.1.3's LoHa and LoKr apply alpha / rank twice in `get_diff_weight` (and so in
`get_merged_weight` / `merge_to`) while their forward applies it once; for those two the merged weight
is rebuilt from `get_weight` exactly as their forward does. Every other algorithm uses
`get_merged_weight`.

Every merge runs in float32: lycoris merges in the weight's dtype, so a bf16 weight (or a quantized
one, `precision.Fp8Linear` / `Int8Linear`, which lycoris cannot merge into at all) is replaced for the
merge by a dense float32 copy of it (dequantized: data times its row scale, an int8 ConvRot
weight rotated back), and the merged weight comes back in the dtype the linear computes in (`base_dtype`),
never quantized.
"""

from __future__ import annotations

import torch
from lycoris.modules.base import LycorisBaseModule
from lycoris.modules.loha import LohaModule
from lycoris.modules.lokr import LokrModule
from torch import nn

from kohakumoss.precision import Fp8Linear, Int8Linear, Mxfp8Linear, base_dtype
from kohakumoss_common.errors import ConfigError

from .io import AdapterSource, load_adapter

QUANTIZED = (Fp8Linear, Int8Linear, Mxfp8Linear)


def dense_weight(module: nn.Module) -> torch.Tensor:
    """A linear's weight as a float32 tensor: an fp8 / int8 one dequantized."""
    if isinstance(module, Int8Linear):
        return module.int8_weight().dequant(torch.float32)
    if isinstance(module, Mxfp8Linear):  # e4m3 times its block's power of two: exact in float32
        return module.mxfp8_weight().dequant(torch.float32)
    if isinstance(module, Fp8Linear):
        return module.weight.float() * module.weight_scale.float().reshape(-1, 1)
    return module.weight.detach().float()


def dense_state_dict(model: nn.Module, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The model's state dict with every quantized linear's weight dense (in the dtype it computes in,
    on `device`; None: the linear's own) and its `weight_scale` dropped: what a merged export writes."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    for name, module in model.named_modules():
        if isinstance(module, QUANTIZED):
            weight = dense_weight(module)
            state[f"{name}.weight"] = weight.to(device or weight.device, base_dtype(module))
            state.pop(f"{name}.weight_scale", None)
    return state


def _dense_twin(module: nn.Module) -> nn.Linear:
    """A float32 nn.Linear with a quantized linear's dequantized weight and its bias (for lycoris's merge)."""
    twin = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    twin.to(module.weight.device)
    twin.weight.data = dense_weight(module)
    if module.bias is not None:
        twin.bias.data = module.bias.detach().float()
    return twin


def _merged(lora: LycorisBaseModule, multiplier: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    org = lora.org_module[0]
    # lycoris merges in the weight's dtype (and not at all into a quantized one): merge on a float32 copy
    if isinstance(org, QUANTIZED) or org.weight.dtype in (torch.bfloat16, torch.float16):
        lora.org_module[0] = _dense_twin(org)
        try:
            return _merged(lora, multiplier)
        finally:
            lora.org_module[0] = org
    weight = org.weight
    if isinstance(lora, (LohaModule, LokrModule)):
        base = weight.float()
        diff = lora.get_weight(lora.shape).to(base) * lora.scalar.to(base)
        if lora.wd:
            return lora.apply_weight_decompose(base + diff, multiplier), None
        return base + diff * multiplier, None
    return lora.get_merged_weight(multiplier, weight.shape, weight.device)


def _each_merged(model: nn.Module, source: AdapterSource, multiplier: float, only: set[str] | None):
    """(module name, module, merged weight, merged bias or None) per adapted linear, one at a time; the
    network waits on the host and each module visits its linear's device for its merge alone."""
    network = load_adapter(model, source, multiplier=1.0, apply=False, device="cpu")
    names = {id(m): n for n, m in model.named_modules()}
    for lora in network.loras:
        module = lora.org_module[0]
        if only is not None and names[id(module)] not in only:
            continue
        lora.to(module.weight.device)
        lora.eval()
        w, b = _merged(lora, multiplier)
        lora.to("cpu")
        yield names[id(module)], module, w.detach(), None if b is None else b.detach()


@torch.no_grad()
def merged_weights(
    model: nn.Module,
    source: AdapterSource,
    multiplier: float = 1.0,
    only: set[str] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """{native key: merged tensor} for every weight (and bias) the adapter changes (`only`: of these
    native module names), merged in float32 and returned in `dtype` (None: the dtype each linear
    computes in) on `device` (None: the linear's own; exports pass the host, since a whole model's
    merge does not fit on the card beside the training state)."""
    out: dict[str, torch.Tensor] = {}
    for key, module, w, b in _each_merged(model, source, multiplier, only):
        to = dtype or base_dtype(module)
        out[f"{key}.weight"] = w.to(device or w.device, to)
        if b is not None:
            out[f"{key}.bias"] = b.to(device or b.device, to)
    return out


def dense_tensor(model: nn.Module, key: str) -> torch.Tensor:
    """One tensor of the model's state as a float32 copy, an fp8 linear's weight dequantized."""
    module_name, _, leaf = key.rpartition(".")
    module = model.get_submodule(module_name)
    if leaf == "weight":
        return dense_weight(module)
    return getattr(module, leaf).detach().float()


@torch.no_grad()
def weight_diffs(
    model: nn.Module, source: AdapterSource, multiplier: float = 1.0, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """{native key: merged - base} in float32 on `device` (each moved there as it is made), for exports
    that carry a full weight difference (the base of an fp8 linear dequantized, so the difference is the
    adapter's alone; W is not rounded before the subtraction)."""
    out: dict[str, torch.Tensor] = {}
    for key, _, w, b in _each_merged(model, source, multiplier, None):
        for leaf, merged in (("weight", w), ("bias", b)):
            if merged is not None:
                out[f"{key}.{leaf}"] = (merged.float() - dense_tensor(model, f"{key}.{leaf}")).to(device)
    return out


def merged_state_dict(
    model: nn.Module, source: AdapterSource, multiplier: float = 1.0, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """The model's full state dict with the adapter merged (unchanged tensors are shared, not copied; fp8
    linears dense, `dense_state_dict`); the merged tensors on `device` (see merged_weights)."""
    state = dense_state_dict(model, device)
    state.update(merged_weights(model, source, multiplier, device=device))
    return state


@torch.no_grad()
def merge_into(model: nn.Module, source: AdapterSource, multiplier: float = 1.0) -> nn.Module:
    """Write the merged weights into `model` (which must not carry the live network's forward)."""
    if any(isinstance(m, QUANTIZED) for m in model.modules()):
        raise ConfigError(
            "BASE_PRECISION",
            "merging into a quantized base's stored weights would round the merge to fp8 / int8; "
            "write the merged weights out (merged_state_dict) or load the base with 'same'",
        )
    params = dict(model.named_parameters())
    for key, value in merged_weights(model, source, multiplier).items():
        params[key].copy_(value)
    return model
