"""Precision modes beyond the compute dtype: frozen base linears in float8 (`fp8_base`) or int8 (`int8_base`)."""

from .fp8_base import (
    BASE_PRECISIONS,
    Fp8Linear,
    base_dtype,
    frozen_weight,
    quantize_frozen_linears,
)
from .fp16 import fp32_residuals, placed_scaled_step, wants_fp32_residuals
from .int8_base import Int8Linear, stored_int8_weights
from .mxfp8_base import Mxfp8Linear

__all__ = [
    "BASE_PRECISIONS",
    "Fp8Linear",
    "Int8Linear",
    "Mxfp8Linear",
    "base_dtype",
    "fp32_residuals",
    "frozen_weight",
    "placed_scaled_step",
    "quantize_frozen_linears",
    "stored_int8_weights",
    "wants_fp32_residuals",
]
