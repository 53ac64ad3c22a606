"""ComfyUI's LoRA / LoHa / LoKr / GLoRA / diff weight patching (comfy/weight_adapter), re-implemented.

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
_DOTTED = (  # entry names that hold a dot
    "lora_up.weight",
    "lora_down.weight",
    "lora_mid.weight",
    "a1.weight",
    "a2.weight",
    "b1.weight",
    "b2.weight",
)


def _alpha(entry: dict, dim: int | None) -> float:
    return float(entry["alpha"]) / dim if "alpha" in entry and dim is not None else 1.0


def glora_rank(a1: torch.Tensor, a2: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, shape) -> int:
    """ComfyUI's GLoRA rank: the new layout (W a1 a2 + b1 b2) unless only the old one fits."""
    old = b2.shape[1] == b1.shape[0] == a1.shape[0] == a2.shape[1]
    new = b2.shape[0] == b1.shape[1] == a1.shape[1] == a2.shape[0]
    if new and not (old and a2.shape[0] == shape[0] and shape[0] == shape[1]):
        return a2.shape[0]
    raise CheckpointError(
        "<comfy adapter>", "GLoRA entry in the old LyCORIS layout: not written by this exporter"
    )


def oft_rotation_q(entry: dict[str, torch.Tensor]) -> torch.Tensor:
    """The skew-symmetric Q of an OFT entry after ComfyUI's constraint (alpha > 0: Q scaled down to norm
    alpha when above it, the norm taken over all blocks at once); R = (I + Q)(I - Q)^-1 per block."""
    blocks = entry["oft_blocks"].float()
    q = blocks - blocks.transpose(-1, -2)
    alpha = float(entry["alpha"]) if "alpha" in entry else 0.0
    norm = torch.norm(q) + 1e-8
    return q * alpha / norm if alpha > 0 and norm > alpha else q


def boft_weight(entry: dict, weight: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
    """ComfyUI's BOFT (`oft_blocks` [stages, blocks, b, b]): each stage's rotations R_i (at strength s:
    s R_i + (1 - s) I) applied to the rows in butterfly order, then `rescale`; returns the patched
    weight W + s (that - W)."""
    q = oft_rotation_q(entry)
    stages, _, b, _ = q.shape
    eye = torch.eye(b)
    r = (eye + q) @ torch.linalg.inv(eye - q)
    w = weight.float()
    out = w
    for i in range(stages):
        rot = r[i] if strength == 1 else r[i] * strength + (1 - strength) * eye
        k = 2**i * (b // 2)
        out = out.unflatten(0, (-1, 2, k)).transpose(1, 2).flatten(0, 2).unflatten(0, (-1, b))
        out = torch.einsum("bij,bj...->bi...", rot, out)
        out = out.flatten(0, 1).unflatten(0, (-1, k, 2)).transpose(1, 2).flatten(0, 2)
    if "rescale" in entry:
        out = out * entry["rescale"].float()
    return w + strength * (out - w)


def patch_delta(entry: dict, shape: torch.Size, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The weight difference ComfyUI adds at strength 1 (before a DoRA rescale); GLoRA reads `weight`."""
    if "diff" in entry:
        return entry["diff"].float()
    if "lora_up.weight" in entry:
        up, down = entry["lora_up.weight"].float(), entry["lora_down.weight"].float()
        return _alpha(entry, down.shape[0]) * (up.flatten(1) @ down.flatten(1)).reshape(shape)
    if "hada_w1_a" in entry:
        m1 = entry["hada_w1_a"].float() @ entry["hada_w1_b"].float()
        m2 = entry["hada_w2_a"].float() @ entry["hada_w2_b"].float()
        return _alpha(entry, entry["hada_w1_b"].shape[0]) * (m1 * m2).reshape(shape)
    if "oft_blocks" in entry and entry["oft_blocks"].dim() == 4:
        return boft_weight(entry, weight) - weight.float()
    if "oft_blocks" in entry:
        q = oft_rotation_q(entry)
        n = q.shape[-1]
        eye = torch.eye(n)
        r = (eye + q) @ torch.linalg.inv(eye - q)
        w = weight.float().reshape(q.shape[0], n, -1)
        return torch.einsum("knm,kni->kmi", r - eye, w).reshape(shape)
    if "a1.weight" in entry:
        a1, a2, b1, b2 = (entry[f"{n}.weight"].float() for n in ("a1", "a2", "b1", "b2"))
        rank = glora_rank(a1, a2, b1, b2, shape)
        scale = float(entry["alpha"]) / rank if "alpha" in entry else 1.0
        return scale * (weight.float() @ a1 @ a2 + b1 @ b2).reshape(shape)
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


def patched_weight(entry: dict, weight: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
    """ComfyUI's patched float32 weight: W + strength * delta, or with `dora_scale` its weight_decompose
    (W + delta rescaled per input column to dora_scale's norms, then W + strength * (that - W))."""
    w = weight.float()
    if "oft_blocks" in entry and entry["oft_blocks"].dim() == 4:
        return boft_weight(entry, w, strength)
    delta = patch_delta(entry, w.shape, w)
    if "oft_blocks" in entry:  # ComfyUI's OFT scales its rotation's change by strength, then again
        return w + strength * strength * delta
    if "dora_scale" not in entry:
        return w + strength * delta
    calc = w + delta
    norm = calc.transpose(0, 1).reshape(calc.shape[1], -1).norm(dim=1, keepdim=True).transpose(0, 1)
    calc = calc * (entry["dora_scale"].float() / norm)
    return w + strength * (calc - w)


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
    base: dict[str, torch.Tensor],
    adapter: dict[str, torch.Tensor],
    strength: float = 1.0,
    modules: set[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Patched float32 copy of ComfyUI-layout base weights (keys without the diffusion_model. prefix);
    `modules`: patch only these ComfyUI modules."""
    out = {k: v.float().clone() for k, v in base.items()}
    for module, entry in comfy_entries(adapter).items():
        if modules is not None and module not in modules:
            continue
        out[f"{module}.weight"] = patched_weight(entry, out[f"{module}.weight"], strength)
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
