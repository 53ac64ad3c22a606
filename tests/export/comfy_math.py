"""A small re-implementation of ComfyUI's LoRA / LoHa / LoKr / diff weight patching (comfy/weight_adapter).

It reads only the ComfyUI-format file and the ComfyUI-layout base weights, like ComfyUI does.
"""

from __future__ import annotations

from collections import defaultdict

import torch

PREFIX = "diffusion_model."


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


def apply_comfy_adapter(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], strength: float = 1.0
):
    """Patched copy of ComfyUI-layout base weights (keys without the diffusion_model. prefix)."""
    entries: dict[str, dict] = defaultdict(dict)
    for key, t in adapter.items():
        assert key.startswith(PREFIX), key
        rest = key[len(PREFIX) :]
        for suffix in ("lora_up.weight", "lora_down.weight", "diff_b"):
            if rest.endswith("." + suffix):
                entries[rest[: -len(suffix) - 1]][suffix] = t
                break
        else:
            module, _, name = rest.rpartition(".")
            entries[module][name] = t
    out = {k: v.float().clone() for k, v in base.items()}
    for module, entry in entries.items():
        w = out[f"{module}.weight"]
        out[f"{module}.weight"] = w + strength * patch_delta(entry, w.shape)
        if "diff_b" in entry:
            out[f"{module}.bias"] = out[f"{module}.bias"] + strength * entry["diff_b"].float()
    return out
