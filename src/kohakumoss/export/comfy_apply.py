"""ComfyUI's LoRA / LoHa / LoKr / diff weight patching (comfy/weight_adapter), re-implemented.

It reads only the ComfyUI-format file and ComfyUI-layout base weights (q, k, v fused), like ComfyUI does.
The export tests check the ComfyUI-format files against it, and `merge_comfy_adapter` uses it to put
such a file onto a native model when it holds more than plain LoRAs (LoHa, LoKr, diff entries; plain
LoRA files load as LyCORIS networks instead, `adapters/foreign.py`).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from kohakumoss_common.errors import CheckpointError

from .comfy_keys import COMFY_PREFIX, fuse_qkv, fused_members, split_qkv

PREFIX = COMFY_PREFIX
_DOTTED = ("lora_up.weight", "lora_down.weight", "lora_mid.weight")  # entry names that hold a dot


def _alpha(entry: dict, dim: int | None) -> float:
    return float(entry["alpha"]) / dim if "alpha" in entry and dim is not None else 1.0


def patch_delta(entry: dict, shape: torch.Size) -> torch.Tensor:
    if "diff" in entry:
        return entry["diff"].float()
    if "lora_up.weight" in entry:
        up, down = entry["lora_up.weight"].float(), entry["lora_down.weight"].float()
        return _alpha(entry, down.shape[0]) * (up.flatten(1) @ down.flatten(1)).reshape(shape)
    if "hada_w1_a" in entry:
        m1 = entry["hada_w1_a"].float() @ entry["hada_w1_b"].float()
        m2 = entry["hada_w2_a"].float() @ entry["hada_w2_b"].float()
        return _alpha(entry, entry["hada_w1_b"].shape[0]) * (m1 * m2).reshape(shape)
    dim = None
    w1 = entry.get("lokr_w1")
    if w1 is None:
        dim = entry["lokr_w1_b"].shape[0]
        w1 = entry["lokr_w1_a"] @ entry["lokr_w1_b"]
    w2 = entry.get("lokr_w2")
    if w2 is None:
        dim = entry["lokr_w2_b"].shape[0]
        w2 = entry["lokr_w2_a"] @ entry["lokr_w2_b"]
    return _alpha(entry, dim) * torch.kron(w1.float(), w2.float()).reshape(shape)


def comfy_entries(adapter: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{ComfyUI module: {entry name: tensor}} of a ComfyUI-format adapter (keys `diffusion_model.*`)."""
    entries: dict[str, dict] = defaultdict(dict)
    for key, t in adapter.items():
        if not key.startswith(PREFIX):
            raise CheckpointError(
                "<comfy adapter>", f"key '{key}' lacks the '{PREFIX}' prefix of ComfyUI adapters"
            )
        rest = key[len(PREFIX) :]
        for suffix in _DOTTED:
            if rest.endswith("." + suffix):
                entries[rest[: -len(suffix) - 1]][suffix] = t
                break
        else:
            module, _, name = rest.rpartition(".")
            entries[module][name] = t
    return dict(entries)


def apply_comfy_adapter(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], strength: float = 1.0
) -> dict[str, torch.Tensor]:
    """Patched float32 copy of ComfyUI-layout base weights (keys without the diffusion_model. prefix)."""
    out = {k: v.float().clone() for k, v in base.items()}
    for module, entry in comfy_entries(adapter).items():
        w = out[f"{module}.weight"]
        out[f"{module}.weight"] = w + strength * patch_delta(entry, w.shape)
        if "diff_b" in entry:
            out[f"{module}.bias"] = out[f"{module}.bias"] + strength * entry["diff_b"].float()
    return out


def is_comfy_adapter(keys) -> bool:
    return any(k.startswith(PREFIX) for k in keys)


@torch.no_grad()
def merge_comfy_adapter(
    model: torch.nn.Module, adapter: dict[str, torch.Tensor], strength: float = 1.0
) -> list[str]:
    """Patch a native MossBackbone in place with a ComfyUI-format adapter; returns the native keys changed.

    The touched weights go to the ComfyUI layout (q, k, v fused), are patched as ComfyUI would, and are
    split back.
    """
    state = model.state_dict()
    touched, missing = {}, []
    for module in comfy_entries(adapter):
        for native in fused_members(module) or (module,):
            keys = [f"{native}.{p}" for p in ("weight", "bias") if f"{native}.{p}" in state]
            if not keys:
                missing.append(module)
            touched.update({k: state[k] for k in keys})
    if missing:
        raise CheckpointError("<comfy adapter>", f"modules not in this model: {sorted(set(missing))[:5]}")
    patched = split_qkv(apply_comfy_adapter(fuse_qkv(touched), adapter, strength))
    for key, tensor in patched.items():
        param = model.get_parameter(key)
        param.copy_(tensor.to(param.dtype))
    return sorted(patched)
