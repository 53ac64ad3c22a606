"""Precision modes beyond the compute dtype: frozen base linears in float8 (`fp8_base`)."""

from .fp8_base import (
    BASE_PRECISIONS,
    Fp8Linear,
    base_dtype,
    base_precision_problem,
    frozen_weight,
    quantize_frozen_linears,
)

__all__ = [
    "BASE_PRECISIONS",
    "Fp8Linear",
    "base_dtype",
    "base_precision_problem",
    "frozen_weight",
    "quantize_frozen_linears",
]
