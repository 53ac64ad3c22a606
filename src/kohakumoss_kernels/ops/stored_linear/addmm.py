"""stored_linear's weight-only form for every stored kind, on any card: the rows dequantized to x's dtype
per call (the rotation of a ConvRot int8 weight left on x), never saved for the backward, which
dequantizes again for its input gradient."""

from __future__ import annotations

import dataclasses

import torch

from ...weights import fp8, int8, mxfp8
from ...weights.stored_weight import StoredWeight

WEIGHTS = ("fp8", "int8", "mxfp8")
_FORMATS = {"fp8": fp8, "int8": int8, "mxfp8": mxfp8}  # each format's frozen_linear and its GEMMs


def stored_linear(x: torch.Tensor, weight: StoredWeight, bias: torch.Tensor | None) -> torch.Tensor:
    # compute=False: the format's own weight-only path, whatever the weight was quantized for
    return _FORMATS[weight.kind].frozen_linear(x, dataclasses.replace(weight, compute=False), bias)
