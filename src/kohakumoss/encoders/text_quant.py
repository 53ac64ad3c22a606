"""The text encoder's block linears in fp8 or int8 (`TextEncoderConfig.quant`), through the same
`Fp8Linear` / `Int8Linear` as the DiT's frozen bases (`kohakumoss.precision`).

Every nn.Linear inside the decoder blocks (attention q/k/v/o, the Gated DeltaNet projections, the MLP)
is quantized; the embedding table and the norms stay in the encoder's dtype. The encoder only runs
forwards (no gradient), so `fp8` / `int8` are its GEMMs' precision and `*_weight` its storage alone.
"""

from __future__ import annotations

import torch
from torch import nn

from kohakumoss.precision.fp8_base import check_device as check_device_for
from kohakumoss.precision.fp8_base import quantize_linear
from kohakumoss.precision.int8_base import to_int8

from .text_config import TEXT_QUANTS

KNOB = "TEXT_ENCODER_QUANT"


def block_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name under the text model, linear) of every plain nn.Linear inside the decoder blocks."""
    return [
        (f"layers.{i}.{name}", m)
        for i, block in enumerate(model.layers)
        for name, m in block.named_modules()
        if type(m) is nn.Linear
    ]


def check_device(mode: str, device: torch.device | str | None) -> None:
    """A ConfigError naming TEXT_ENCODER_QUANT when `mode`'s GEMMs do not run on `device`."""
    check_device_for(KNOB, mode, torch.device(device) if device is not None else None)


def quantize_text_linears(
    model: nn.Module, mode: str, device: torch.device | str | None = None, ops=None
) -> int:
    """Quantize the decoder blocks' linears of a loaded Qwen3.5 text model per `mode`; returns how many
    (linears an int8 file already put in int8 are left as they are)."""
    if mode not in TEXT_QUANTS:
        raise ValueError(f"text encoder quant '{mode}' is not one of {TEXT_QUANTS}")
    if mode == "none":
        return 0
    check_device(mode, device)
    linears = block_linears(model)
    for _, lin in linears:
        lin.requires_grad_(False)
        quantize_linear(lin, mode, ops=ops)
    return len(linears)


def keep_stored_int8(
    model: nn.Module, name: str, data: torch.Tensor, scale: torch.Tensor, group: int, mode: str, device, dtype
) -> bool:
    """While streaming an int8 file in an int8 mode: put weight `name`'s stored bytes into its block
    linear as an Int8Linear (no dequantization, no second rounding). False when `name` is not a block
    linear's weight (the caller dequantizes it)."""
    if not mode.startswith("int8") or not name.startswith("layers.") or not name.endswith(".weight"):
        return False
    module = model.get_submodule(name.removesuffix(".weight"))
    if type(module) is not nn.Linear:
        return False
    s = scale.float().reshape(-1)
    s = s.expand(data.shape[0]).clone() if s.numel() == 1 else s
    to_int8(module, mode == "int8", (data, s, group), device=device, source_dtype=dtype)
    return True
