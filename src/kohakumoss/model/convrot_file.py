"""Write a DiT as Comfy-Org ships its int8 base (`diffusion_models/moss_image_base_int8_convrot.safetensors`).

The comfy layout (q, k, v fused, keys under `model.diffusion_model.`), every block matrix whose input
width is a multiple of the group stored ConvRot int8 (`kohakumoss_common.quant.convrot_quantize`: data,
a float32 row scale and a `comfy_quant` marker), the rest in bf16. For the 5B model that is the 252 block
matrices the published file quantizes. Benchmarks and tests write such a file from random weights, so an
int8 base is measured and loaded as users run it without a model hub.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kohakumoss_common.io import save_safetensors
from kohakumoss_common.quant import convrot_marker, convrot_quantize

from .backbone import MossBackbone
from .io import DERIVED_KEYS
from .layouts import LAYOUTS

CONVROT_GROUP = 256  # the published files' `convrot_groupsize`


def convrot_state(
    state: dict[str, torch.Tensor], group: int = CONVROT_GROUP, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """A native state dict in the comfy layout with its block matrices ConvRot int8 (no key prefix), on the
    host. device: where the rotation is computed (a GPU does the 5B model's in seconds)."""
    comfy = LAYOUTS["comfy"].from_native({k: v for k, v in state.items() if k not in DERIVED_KEYS})
    out: dict[str, torch.Tensor] = {}
    for key, tensor in comfy.items():
        block_matrix = key.startswith("layers.") and key.endswith(".weight") and tensor.dim() == 2
        if block_matrix and tensor.shape[1] % group == 0:
            data, scale = convrot_quantize(tensor.to(device or tensor.device), group)
            stem = key.removesuffix(".weight")
            out[key], out[stem + ".weight_scale"] = data.cpu(), scale.cpu()
            out[stem + ".comfy_quant"] = convrot_marker(group)
        else:
            out[key] = tensor.to("cpu", torch.bfloat16) if tensor.is_floating_point() else tensor.cpu()
    return out


def save_convrot_dit(
    model_or_state: MossBackbone | dict[str, torch.Tensor],
    path: str | Path,
    group: int = CONVROT_GROUP,
    device: torch.device | str | None = None,
) -> Path:
    """Write the DiT to `path` (one .safetensors, atomically) as the Comfy-Org ConvRot int8 file; returns it."""
    if isinstance(model_or_state, MossBackbone):
        model_or_state = {k: v.detach() for k, v in model_or_state.state_dict().items()}
    prefix = LAYOUTS["comfy"].save_prefix
    tensors = {prefix + k: v.contiguous() for k, v in convrot_state(model_or_state, group, device).items()}
    save_safetensors(tensors, Path(path))
    return Path(path)
