"""Quantized weights in a single-file checkpoint: what can be dequantized at load, what is refused.

Dequantized at load (weight-only, precisely defined):
- int8 or float8 weights with a per-tensor or per-row scale under `<name>.weight_scale` (ComfyUI
  `comfy_quant` format `int8_tensorwise` / `float8_e4m3fn` / `float8_e5m2`) or `<name>.scale_weight`
  (legacy ComfyUI scaled fp8): `weight = q.float() * scale` (scale broadcast over rows).
  Activation scales (`input_scale`, `scale_input`) only matter for w8a8 inference and are dropped.

Refused with a `CheckpointError` that names the scheme: ComfyUI "convrot" (int8 with a Hadamard
rotation whose exact matrix is not verified here), block-wise scales, and any other format or
dtype without a scale. The ComfyUI marker layout was built from public descriptions, not real files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import iter_tensors

PLAIN_DTYPES = {"F32", "F16", "BF16", "F64", "I64", "I32", "BOOL"}
QUANT_DTYPES = {"I8", "F8_E4M3", "F8_E5M2"}
SCALE_SUFFIXES = (".weight_scale", ".scale_weight")
DROPPED_SUFFIXES = (".input_scale", ".scale_input", ".comfy_quant")
DROPPED_KEYS = {"scaled_fp8"}
KNOWN_FORMATS = {"int8_tensorwise", "float8_e4m3fn", "float8_e5m2"}

Header = dict[str, tuple[str, list[int]]]


@dataclass
class QuantPlan:
    """weight key -> scale key for dequantization; keys that carry no weight of their own."""

    scales: dict[str, str] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    @property
    def scheme(self) -> str:
        return "none" if not self.scales else "weight-only scaled int8/fp8 (dequantized at load)"


def _read_markers(path: Path, header: Header) -> dict[str, object]:
    keys = {k for k in header if k.endswith(".comfy_quant")}
    if not keys:
        return {}
    markers = {}
    for key, tensor in iter_tensors(path, keys=keys):
        raw = bytes(tensor.to(torch.uint8).flatten().tolist()).rstrip(b"\x00")
        try:
            markers[key] = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(path, f"{key}: unreadable quantization marker ({e})") from e
    return markers


def _check_marker(path: Path, key: str, marker: object) -> None:
    conf = marker if isinstance(marker, dict) else {"format": marker}
    fmt = conf.get("format")
    if conf.get("convrot"):
        group = conf.get("convrot_groupsize", "?")
        raise CheckpointError(
            path,
            f"{key}: quantization scheme '{fmt}' with ConvRot (Hadamard-rotated int8, group size {group}) "
            "is not supported; dequantize the file to bf16 first or load the HF folder",
        )
    if fmt not in KNOWN_FORMATS:
        raise CheckpointError(path, f"{key}: unknown quantization scheme {conf!r}")


def _scale_ok(weight_shape: list[int], scale_shape: list[int]) -> bool:
    n = 1
    for s in scale_shape:
        n *= s
    rows = weight_shape[0] if weight_shape else 1
    return n == 1 or (n == rows and all(s in (1, rows) for s in scale_shape))


def plan_quantization(path: str | Path, header: Header) -> QuantPlan:
    """Check every quantized tensor in `header`; raise a `CheckpointError` naming any unsupported scheme."""
    path = Path(path)
    for key, marker in _read_markers(path, header).items():
        _check_marker(path, key, marker)
    plan = QuantPlan()
    plan.dropped = {k for k in header if k.endswith(DROPPED_SUFFIXES) or k in DROPPED_KEYS}
    for key, (dtype, shape) in header.items():
        if key in plan.dropped or key.endswith(SCALE_SUFFIXES):
            continue
        if dtype in PLAIN_DTYPES:
            continue
        stem = key.removesuffix(".weight")
        scale = next((stem + s for s in SCALE_SUFFIXES if stem + s in header), None)
        if dtype not in QUANT_DTYPES or scale is None or not key.endswith(".weight"):
            raise CheckpointError(path, f"{key}: unknown quantization scheme (dtype {dtype}, no scale key)")
        if not _scale_ok(shape, header[scale][1]):
            raise CheckpointError(
                path,
                f"{scale}: scale of shape {header[scale][1]} for weight {shape} is not per-tensor or "
                "per-row (block-wise quantization is not supported)",
            )
        plan.scales[key] = scale
    plan.dropped |= {k for k in header if k.endswith(SCALE_SUFFIXES)}
    return plan


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight * scale` in float32, then cast to `dtype` (scale is per tensor or per row)."""
    s = scale.float().reshape(-1)
    s = s.reshape(-1, *([1] * (weight.dim() - 1))) if s.numel() > 1 else s.reshape(())
    return (weight.float() * s).to(dtype)
