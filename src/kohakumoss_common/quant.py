"""Quantized weights in a single-file checkpoint: what can be dequantized at load, what is refused.

Dequantized at load (weight-only, precisely defined):
- int8 or float8 weights with a per-tensor or per-row scale under `<name>.weight_scale` (ComfyUI
  `comfy_quant` format `int8_tensorwise` / `float8_e4m3fn` / `float8_e5m2`) or `<name>.scale_weight`
  (legacy ComfyUI scaled fp8): `weight = q.float() * scale` (scale broadcast over rows).
  Activation scales (`input_scale`, `scale_input`) only matter for w8a8 inference and are dropped.
- ConvRot int8 (`{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}`, or the
  ComfyUI-INT8-Fast marker `{"convrot": true, "convrot_groupsize": 256, "per_row": true}`): the weight
  was rotated per group of `g` input columns, `W_rot = W @ H^T`, H the normalised *regular* Hadamard
  (Kronecker power of H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]], / sqrt(g); symmetric, H @ H = I),
  then int8 per row. Dequantized as comfy-kitchen does: `W = (q * scale) @ H^T` per group (read in
  Comfy-Org/comfy-kitchen 7d86acf `tensor/int8_utils.py`, `backends/eager/quantization.py`, and
  Comfy-Org/comfy-quants 55f0a26 `docs/formats/int8_w8a8.md`, `formats/convrot.py`). Only loaders that
  un-rotate ask for it (`plan_quantization(..., rotations=True)`, then `QuantPlan.dequantize`);
  elsewhere a ConvRot file is refused by name, never dequantized without its rotation.

Refused with a `CheckpointError` that names the scheme: block-wise scales, and any other format or
dtype without a scale.
"""

from __future__ import annotations

import json
import math
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
# the published regular H4 (no all-ones column); ConvRot's Hadamards are its Kronecker powers
REGULAR_H4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))

Header = dict[str, tuple[str, list[int]]]


@dataclass
class QuantPlan:
    """weight key -> scale key for dequantization; ConvRot weights' group sizes; keys that carry no
    weight of their own."""

    scales: dict[str, str] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    rotations: dict[str, int] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        if not self.scales:
            return "none"
        if self.rotations:
            return f"ConvRot int8 ({len(self.rotations)} of {len(self.scales)} weights rotated; dequantized at load)"
        return "weight-only scaled int8/fp8 (dequantized at load)"

    def dequantize(
        self, key: str, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The float weight of quantized `key` (its stored tensor and scale), un-rotated where ConvRot."""
        return dequantize(weight, scale, dtype, self.rotations.get(key, 0))


def _is_power_of_four(n: int) -> bool:
    return n >= 4 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


_HADAMARDS: dict[tuple[int, str], torch.Tensor] = {}


def convrot_hadamard(size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """ConvRot's normalised regular Hadamard [size, size] float32 (size a power of four)."""
    if not _is_power_of_four(size):
        raise ValueError(f"ConvRot group size must be a power of four, got {size}")
    key = (size, str(device))
    if key not in _HADAMARDS:
        h4 = torch.tensor(REGULAR_H4, dtype=torch.float32, device=device)
        h = h4
        while h.shape[0] < size:
            h = torch.kron(h, h4)
        _HADAMARDS[key] = h / math.sqrt(size)
    return _HADAMARDS[key]


def unrotate(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """`weight @ H^T` per group of `group_size` input columns (float32): undoes ConvRot's rotation
    (comfy-kitchen's `_rotate_weight`; H is symmetric and H @ H = I)."""
    out_f, in_f = weight.shape
    h = convrot_hadamard(group_size, weight.device)
    return (weight.float().reshape(out_f, in_f // group_size, group_size) @ h.T).reshape(out_f, in_f)


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


def _marker_rotation(path: Path, key: str, marker: object, header: Header, rotations: bool) -> int:
    """Check one `comfy_quant` marker; the ConvRot group size of its weight (0 when not rotated)."""
    conf = marker if isinstance(marker, dict) else {"format": marker}
    fmt = conf.get("format")
    if fmt is None and ("convrot" in conf or "per_row" in conf):
        fmt = "int8_tensorwise"  # ComfyUI-INT8-Fast's marker (comfy-quants) names no format
    if fmt not in KNOWN_FORMATS:
        raise CheckpointError(path, f"{key}: unknown quantization scheme {conf!r}")
    if not conf.get("convrot"):
        return 0
    group = conf.get("convrot_groupsize", 256)
    weight = key.removesuffix(".comfy_quant") + ".weight"
    if not rotations:
        raise CheckpointError(
            path,
            f"{key}: quantization scheme '{fmt}' with ConvRot (Hadamard-rotated int8, group size {group}) "
            "is not supported by this loader; dequantize the file to bf16 first or load the HF folder",
        )
    if fmt != "int8_tensorwise" or not isinstance(group, int) or not _is_power_of_four(group):
        raise CheckpointError(
            path, f"{key}: unsupported ConvRot marker {conf!r} (int8 with a power-of-four group)"
        )
    if weight not in header or header[weight][0] != "I8" or len(header[weight][1]) != 2:
        found = header.get(weight, ("absent", []))
        raise CheckpointError(
            path, f"{key}: ConvRot marker for '{weight}', which is {found[0]} {found[1]}, not 2-d int8"
        )
    if header[weight][1][1] % group:
        raise CheckpointError(
            path,
            f"{weight}: {header[weight][1][1]} input columns do not split into ConvRot groups of {group}",
        )
    return group


def _scale_ok(weight_shape: list[int], scale_shape: list[int]) -> bool:
    n = 1
    for s in scale_shape:
        n *= s
    rows = weight_shape[0] if weight_shape else 1
    return n == 1 or (n == rows and all(s in (1, rows) for s in scale_shape))


def plan_quantization(path: str | Path, header: Header, rotations: bool = False) -> QuantPlan:
    """Check every quantized tensor in `header`; raise a `CheckpointError` naming any unsupported scheme.

    rotations: the caller dequantizes through `QuantPlan.dequantize`, which un-rotates ConvRot weights;
    without it a ConvRot marker is refused by name.
    """
    path = Path(path)
    plan = QuantPlan()
    for key, marker in _read_markers(path, header).items():
        group = _marker_rotation(path, key, marker, header, rotations)
        if group:
            plan.rotations[key.removesuffix(".comfy_quant") + ".weight"] = group
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


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group_size: int = 0
) -> torch.Tensor:
    """`weight * scale` in float32 (scale per tensor or per row), un-rotated per `group_size` input
    columns when ConvRot (0: not rotated), then cast to `dtype`."""
    s = scale.float().reshape(-1)
    s = s.reshape(-1, *([1] * (weight.dim() - 1))) if s.numel() > 1 else s.reshape(())
    w = weight.float() * s
    return (unrotate(w, group_size) if group_size else w).to(dtype)
