"""LoRA files in the published key styles, read as LyCORIS state dicts (then loaded like our own files).

Accepted, per module of the released DiT (`layers.N.proj.q`, `text_embedder.blocks.N.qkv`, ...):

- kohya / ComfyUI: `diffusion_model.<module>.lora_down.weight`, `.lora_up.weight`, `.alpha` (the published
  MOSS LoRAs; also `model.diffusion_model.`, no prefix, or `lora_unet_<module with _>`);
- PEFT / diffusers: `<module>.lora_A.weight` (down), `.lora_B.weight` (up), optionally `.default`, with
  `transformer.` or `base_model.model.` or no prefix;
- Comfy-Org's fused `layers.N.proj.qkv` (our ComfyUI export): the fused up's row thirds become q, k
  and v LoRAs sharing the down; up columns that are zero for a member are dropped with their down rows
  (alpha scaled along), so an export of separate LoRAs comes back at their own ranks. Exact either way.

A module without `.alpha` is scaled by 1 (alpha = rank), as ComfyUI and the public ports read such files.
Keys that name no linear of the model, or no LoRA tensor, are refused by name (`strict`); ComfyUI only
logs "lora key not loaded" for them, which `strict=False` does here too.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch import nn

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.log import get_logger

from .targets import LORA_PREFIX, lycoris_name

log = get_logger(__name__)

PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.", "base_model.model.")
KOHYA_UNDERSCORE = "lora_unet_"
# file suffix -> the LyCORIS (LoCon) entry it holds
SUFFIXES = {
    ".lora_down.weight": "lora_down.weight",
    ".lora_up.weight": "lora_up.weight",
    ".lora_A.weight": "lora_down.weight",
    ".lora_B.weight": "lora_up.weight",
    ".lora_A.default.weight": "lora_down.weight",
    ".lora_B.default.weight": "lora_up.weight",
    ".alpha": "alpha",
}
_FUSED_QKV = re.compile(r"^(layers\.\d+\.proj)\.qkv$")
_SHOWN = 8  # keys named in an error message


def is_lycoris_state(keys) -> bool:
    """Our own (LyCORIS) files: every key starts with the `lycoris_` module prefix."""
    keys = list(keys)
    return bool(keys) and all(k.startswith(f"{LORA_PREFIX}_") for k in keys)


def is_lora_state(keys) -> bool:
    """Plain LoRA tensors only (down, up, alpha), in any of the accepted styles."""
    keys = list(keys)
    return bool(keys) and all(_suffix(k) is not None for k in keys)


def _suffix(key: str) -> str | None:
    return next((s for s in SUFFIXES if key.endswith(s)), None)


def _module_names(model: nn.Module) -> dict[str, str]:
    """Every name a file may use for a LoRA target -> its native name: the model's linears, their
    `lora_unet_` underscore forms, and the fused `layers.N.proj.qkv` of each block."""
    names = {n: n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    fused = {f"{m.group(1)}.qkv" for n in names if (m := re.match(r"^(layers\.\d+\.proj)\.q$", n))}
    names.update({f: f for f in fused})
    names.update({KOHYA_UNDERSCORE + n.replace(".", "_"): n for n in list(names)})
    return names


def _native(module: str, names: dict[str, str]) -> str | None:
    for prefix in ("", *PREFIXES):
        if module.startswith(prefix) and module[len(prefix) :] in names:
            return names[module[len(prefix) :]]
    return None


def _trimmed(up: torch.Tensor, down: torch.Tensor, alpha: float) -> tuple | None:
    """(up, down, alpha) without the rank columns this member's up never uses (same product and scale)."""
    keep = up.ne(0).any(0)
    if not keep.any():
        return None
    r = int(keep.sum())
    return up[:, keep], down[keep], alpha * r / down.shape[0]


def _unused(where, unused: list[str], strict: bool) -> None:
    if not unused:
        return
    text = f"{len(unused)} keys name no linear of this model or no LoRA tensor: {sorted(unused)[:_SHOWN]}"
    if strict:
        raise CheckpointError(where, text)
    log.warning(f"{where}: {text}; loading the rest (ComfyUI's 'lora key not loaded')")


def to_lycoris_state(
    model: nn.Module, sd: dict[str, torch.Tensor], where: object = "<state dict>", strict: bool = True
) -> dict[str, torch.Tensor]:
    """A kohya / PEFT / ComfyUI-fused LoRA state dict as the LyCORIS (LoCon) state dict of `model`."""
    names = _module_names(model)
    entries: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    origin: dict[tuple[str, str], str] = {}
    unused = []
    for key, tensor in sd.items():
        suffix = _suffix(key)
        native = _native(key[: -len(suffix)], names) if suffix else None
        if native is None:
            unused.append(key)
            continue
        slot = (native, SUFFIXES[suffix])
        if slot in origin:
            raise CheckpointError(where, f"'{key}' and '{origin[slot]}' hold the same tensor of {native}")
        origin[slot] = key
        entries[native][SUFFIXES[suffix]] = tensor
    _unused(where, unused, strict)
    out: dict[str, torch.Tensor] = {}
    for module, entry in entries.items():
        if "lora_up.weight" not in entry or "lora_down.weight" not in entry:
            raise CheckpointError(where, f"LoRA of '{module}' lacks its up or down matrix")
        up, down = entry["lora_up.weight"], entry["lora_down.weight"]
        alpha = float(entry["alpha"]) if "alpha" in entry else float(down.shape[0])
        m = _FUSED_QKV.match(module)
        if m is None:
            parts = [(module, (up, down, alpha))]
        else:
            members = [f"{m.group(1)}.{p}" for p in ("q", "k", "v")]
            if up.shape[0] % 3:
                raise CheckpointError(where, f"fused '{module}' up has {up.shape[0]} rows, not 3 equal parts")
            rows = up.chunk(3, 0)
            parts = [(n, _trimmed(u, down, alpha)) for n, u in zip(members, rows, strict=True)]
        for native, terms in parts:
            if terms is None:
                continue  # a member the fused LoRA leaves at zero
            _put(out, model, native, *terms, where, origin)
    return out


def _put(out: dict, model: nn.Module, native: str, up, down, alpha: float, where, origin) -> None:
    linear = model.get_submodule(native)
    name = lycoris_name(native)
    if f"{name}.lora_up.weight" in out:
        raise CheckpointError(where, f"'{native}' is given both on its own and inside a fused qkv")
    rank = down.shape[0]
    want_up, want_down = (linear.out_features, rank), (rank, linear.in_features)
    if tuple(up.shape) != want_up or tuple(down.shape) != want_down:
        key = origin.get((native, "lora_up.weight")) or native
        raise CheckpointError(
            where,
            f"'{key}': up {tuple(up.shape)} / down {tuple(down.shape)} do not fit {native} "
            f"[{linear.out_features}, {linear.in_features}] (a LoRA of another model?)",
        )
    out[f"{name}.lora_up.weight"] = up.contiguous()
    out[f"{name}.lora_down.weight"] = down.contiguous()
    out[f"{name}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
