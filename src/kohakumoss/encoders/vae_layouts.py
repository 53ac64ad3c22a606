"""FLUX.2 VAE key names: original BFL / ComfyUI single files <-> diffusers `AutoencoderKLFlux2`.

The BFL names follow diffusers' own conversion script (`scripts/convert_flux2_to_diffusers.py`,
LDM-style `encoder.down.{i}.block.{j}`, `mid.attn_1.q` as 1x1 convs, `encoder.quant_conv`,
`decoder.post_quant_conv`, `bn.running_*`). Built from that public source; NOT verified against the
real `flux2-vae.safetensors` or ComfyUI's `flux2-vae_small` files. Every key name lives here.
"""

from __future__ import annotations

import re

import torch

PREFIXES = ("first_stage_model.", "vae.")
_DIRECT = {
    "encoder.norm_out": "encoder.conv_norm_out",
    "decoder.norm_out": "decoder.conv_norm_out",
    "encoder.quant_conv": "quant_conv",
    "decoder.post_quant_conv": "post_quant_conv",
}
_ATTN = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}
_ATTN_BACK = {v: k for k, v in _ATTN.items()}


def is_bfl(keys: list[str]) -> bool:
    """True when the keys use the original (LDM-style) names rather than diffusers names."""
    return any(re.match(r"^(encoder|decoder)\.(down|up|mid)\.", strip_prefix(k)) for k in keys)


def strip_prefix(key: str) -> str:
    for p in PREFIXES:
        if key.startswith(p):
            return key[len(p) :]
    return key


def count_up_levels(keys: list[str]) -> int:
    """How many decoder levels a BFL-named checkpoint has (`decoder.up.{i}`)."""
    levels = {int(m.group(1)) for k in keys if (m := re.match(r"^decoder\.up\.(\d+)\.", strip_prefix(k)))}
    return max(levels) + 1 if levels else 0


def _resnet(rest: str) -> str:
    return rest.replace("nin_shortcut", "conv_shortcut")


def bfl_to_diffusers(key: str, n_up: int) -> str:
    """One BFL key -> its diffusers name (`n_up` from `count_up_levels`)."""
    key = strip_prefix(key)
    head, _, param = key.rpartition(".")
    if head in _DIRECT:
        return f"{_DIRECT[head]}.{param}"
    if m := re.match(r"^(encoder|decoder)\.mid\.block_(\d+)\.(.+)$", key):
        return f"{m[1]}.mid_block.resnets.{int(m[2]) - 1}.{_resnet(m[3])}"
    if m := re.match(r"^(encoder|decoder)\.mid\.attn_1\.(\w+)\.(\w+)$", key):
        return f"{m[1]}.mid_block.attentions.0.{_ATTN[m[2]]}.{m[3]}"
    if m := re.match(r"^encoder\.down\.(\d+)\.block\.(\d+)\.(.+)$", key):
        return f"encoder.down_blocks.{m[1]}.resnets.{m[2]}.{_resnet(m[3])}"
    if m := re.match(r"^encoder\.down\.(\d+)\.downsample\.conv\.(\w+)$", key):
        return f"encoder.down_blocks.{m[1]}.downsamplers.0.conv.{m[2]}"
    if m := re.match(r"^decoder\.up\.(\d+)\.block\.(\d+)\.(.+)$", key):
        return f"decoder.up_blocks.{n_up - 1 - int(m[1])}.resnets.{m[2]}.{_resnet(m[3])}"
    if m := re.match(r"^decoder\.up\.(\d+)\.upsample\.conv\.(\w+)$", key):
        return f"decoder.up_blocks.{n_up - 1 - int(m[1])}.upsamplers.0.conv.{m[2]}"
    return key


def diffusers_to_bfl(key: str, n_up: int) -> str:
    """One diffusers key -> its BFL name; the inverse of `bfl_to_diffusers` (used for export and tests)."""
    head, _, param = key.rpartition(".")
    back = {v: k for k, v in _DIRECT.items()}
    if head in back:
        return f"{back[head]}.{param}"
    if m := re.match(r"^(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.+)$", key):
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    if m := re.match(r"^(encoder|decoder)\.mid_block\.attentions\.0\.(.+)\.(\w+)$", key):
        return f"{m[1]}.mid.attn_1.{_ATTN_BACK[m[2]]}.{m[3]}"
    if m := re.match(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$", key):
        return f"encoder.down.{m[1]}.block.{m[2]}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    if m := re.match(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(\w+)$", key):
        return f"encoder.down.{m[1]}.downsample.conv.{m[2]}"
    if m := re.match(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$", key):
        rest = m[3].replace("conv_shortcut", "nin_shortcut")
        return f"decoder.up.{n_up - 1 - int(m[1])}.block.{m[2]}.{rest}"
    if m := re.match(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(\w+)$", key):
        return f"decoder.up.{n_up - 1 - int(m[1])}.upsample.conv.{m[2]}"
    return key


def is_attention_weight(diffusers_key: str) -> bool:
    return bool(re.search(r"mid_block\.attentions\.0\.(to_q|to_k|to_v|to_out\.0)\.weight$", diffusers_key))


def bfl_tensor(diffusers_key: str, tensor: torch.Tensor) -> torch.Tensor:
    """BFL attention projections are 1x1 convs; diffusers uses linears ([C, C, 1, 1] -> [C, C])."""
    if is_attention_weight(diffusers_key) and tensor.dim() == 4:
        return tensor[:, :, 0, 0]
    return tensor


def bfl_shape(diffusers_key: str, shape: list[int]) -> tuple[int, ...]:
    """The diffusers shape of a BFL tensor (header only, no data read)."""
    if is_attention_weight(diffusers_key) and len(shape) == 4:
        return tuple(shape[:2])
    return tuple(shape)


def to_bfl_tensor(diffusers_key: str, tensor: torch.Tensor) -> torch.Tensor:
    """Inverse of `bfl_tensor`: linear attention weights back to 1x1 convs."""
    if is_attention_weight(diffusers_key) and tensor.dim() == 2:
        return tensor[:, :, None, None]
    return tensor
