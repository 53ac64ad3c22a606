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
- ComfyUI W4A8 (`comfy_quant` `{"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}`,
  the only 4-bit-weight / 8-bit-activation format ComfyUI's loader reads, so the one a ComfyUI template's
  `*_w4a8*.safetensors` file is in; "gptq" in such a name is how the codes were chosen, which does not
  change how they decode). Per Linear: `<n>.weight` int8 [N, K/2], two 4-bit codes per byte, the even
  column in the low nibble; `<n>.weight_s_rel` [N, K/group] float8 e4m3 (or the same bytes as uint8),
  a group scale relative to the row's; `<n>.weight_s_channel` float32 [N]; `<n>.weight_codebook`
  float32 [16] optional (code -> level; without it the level is code - 8). The weight is the ConvRot int8
  one above on an int8 grid decoded from the codes: `q8 = clamp(round(level[code] * s_rel), -127, 127)`
  per group, `W = (q8 * s_channel) @ H^T` per `convrot_groupsize` columns. The activations' 8 bits are
  quantized per row at run time (no input scale is stored). Read in Comfy-Org/ComfyUI 0271a469
  `comfy/ops.py` `_load_quantized_module` (the keys, the uint8 -> fp8 view, the marker's fields and
  defaults; `weight_correction` is never read there) and `comfy/quant_ops.py` (`QUANT_ALGOS`), and
  Comfy-Org/comfy-kitchen 7d86acf `backends/eager/w4a8_int8.py` (`_dequant_int4_grouped_to_int8`,
  `dequantize_w4a8_int8_weight`: nibble order, the int8 grid, the un-rotation) and
  `tensor/w4a8_int8.py` (`AsymW4A8Int8Layout`: the shapes, `state_dict_tensors`' `_s_rel` /
  `_s_channel` / `_codebook` suffixes). Only loaders that read logical shapes through
  `QuantPlan.shape` ask for it (`plan_quantization(..., packed=True)`); elsewhere it is refused by name.

Markers are `<layer>.comfy_quant` tensors or the header's `_quantization_metadata` layers.
Refused with a `CheckpointError` that names the scheme: GPTQ / AWQ packing (`.qweight`, `.qzeros`,
`.g_idx`: a layout ComfyUI does not read either), asymmetric W4A8 (`weight_correction`, which ComfyUI
drops), block-wise scales, and any other format or dtype without a scale.
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
W4A8_FORMAT = "asym_w4a8_int8"
W4A8_SIDE = (".weight_s_rel", ".weight_s_channel", ".weight_codebook", ".weight_correction")
QUANT_METADATA_KEY = "_quantization_metadata"  # header form of the per-layer markers
GPTQ_SUFFIXES = (".qweight", ".qzeros", ".g_idx")  # AutoGPTQ / GPTQModel / AWQ packing
# the published regular H4 (no all-ones column); ConvRot's Hadamards are its Kronecker powers
REGULAR_H4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))

Header = dict[str, tuple[str, list[int]]]


@dataclass(frozen=True)
class PackedW4A8:
    """One ComfyUI `asym_w4a8_int8` weight: its group scales' and codebook's keys, its group size."""

    s_rel: str
    codebook: str | None
    group_size: int


@dataclass
class QuantPlan:
    """weight key -> scale key for dequantization (a W4A8 weight's row scale `weight_s_channel`);
    ConvRot weights' group sizes; packed W4A8 weights; keys that carry no weight of their own."""

    scales: dict[str, str] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    rotations: dict[str, int] = field(default_factory=dict)
    packed: dict[str, PackedW4A8] = field(default_factory=dict)
    path: Path | None = None  # where a packed weight's group scales and codebook are read from

    @property
    def scheme(self) -> str:
        if not self.scales:
            return "none"
        if self.packed:
            return (
                f"ComfyUI W4A8 {W4A8_FORMAT} ({len(self.packed)} of {len(self.scales)} weights 4-bit, "
                "ConvRot; dequantized at load)"
            )
        if self.rotations:
            return f"ConvRot int8 ({len(self.rotations)} of {len(self.scales)} weights rotated; dequantized at load)"
        return "weight-only scaled int8/fp8 (dequantized at load)"

    def shape(self, key: str, stored: list[int]) -> list[int]:
        """The shape of the weight `key` stands for (a packed W4A8 weight holds two columns a byte)."""
        return [stored[0], stored[1] * 2] if key in self.packed else list(stored)

    def stored(
        self, key: str, weight: torch.Tensor, scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(int8 or fp8 data [O, I], its scale, ConvRot group or 0) of quantized `key` from its stored
        tensor and scale: a packed W4A8 weight decoded to the int8 grid ComfyUI's W4A8 linear runs."""
        group = self.rotations.get(key, 0)
        if key not in self.packed:
            return weight, scale, group
        rec = self.packed[key]
        side = dict(iter_tensors(self.path, keys={k for k in (rec.s_rel, rec.codebook) if k}))
        s_rel = side[rec.s_rel].to(weight.device)
        codebook = side[rec.codebook].to(weight.device) if rec.codebook else None
        return decode_w4a8(weight, s_rel, codebook, rec.group_size), scale, group

    def dequantize(
        self, key: str, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The float weight of quantized `key` (its stored tensor and scale), un-rotated where ConvRot."""
        data, scale, group = self.stored(key, weight, scale)
        return dequantize(data, scale, dtype, group)


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


def convrot_quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The published ConvRot int8 form of `weight` [O, I]: `W @ H^T` per `group_size` input columns, then
    symmetric int8 per row (scale = amax / 127), computed in float64 on the CPU and float32 elsewhere.
    Returns (int8 [O, I], float32 scale [O, 1]); `unrotate(q * scale)` gives the weight back."""
    out_f, in_f = weight.shape
    wide = torch.float64 if weight.device.type == "cpu" else torch.float32
    h = convrot_hadamard(group_size, weight.device).to(wide)
    rotated = (weight.to(wide).reshape(out_f, in_f // group_size, group_size) @ h.T).reshape(out_f, in_f)
    scale = (rotated.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-30)
    return rotated.div(scale).round().clamp(-128, 127).to(torch.int8), scale.float()


def convrot_marker(group_size: int) -> torch.Tensor:
    """The `<layer>.comfy_quant` tensor of a ConvRot int8 weight (uint8 bytes of its JSON)."""
    conf = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group_size}
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def _read_markers(path: Path, header: Header, metadata: dict[str, str] | None = None) -> dict[str, object]:
    """`<layer>.comfy_quant` -> its parsed marker: the marker tensors, then the header's
    `_quantization_metadata` layers (ComfyUI's `comfy/utils.py` `convert_old_quants` turns those into
    marker tensors, over any of the same name: Comfy-Org/ComfyUI 09708eae)."""
    keys = {k for k in header if k.endswith(".comfy_quant")}
    markers = {}
    for key, tensor in iter_tensors(path, keys=keys) if keys else ():
        raw = bytes(tensor.to(torch.uint8).flatten().tolist()).rstrip(b"\x00")
        try:
            markers[key] = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(path, f"{key}: unreadable quantization marker ({e})") from e
    if metadata and QUANT_METADATA_KEY in metadata:
        try:
            layers = json.loads(metadata[QUANT_METADATA_KEY])["layers"]
            markers.update({f"{layer}.comfy_quant": conf for layer, conf in layers.items()})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                path, f"metadata '{QUANT_METADATA_KEY}' has no readable 'layers' ({e!r})"
            ) from e
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


def _w4a8_record(
    path: Path, key: str, conf: dict, header: Header, allowed: bool
) -> tuple[PackedW4A8, str, int]:
    """Check one `asym_w4a8_int8` marker and its tensors; (record, row-scale key, ConvRot group)."""
    stem = key.removesuffix(".comfy_quant")
    weight = stem + ".weight"
    if not allowed:
        raise CheckpointError(
            path,
            f"{key}: quantization scheme '{W4A8_FORMAT}' (ComfyUI W4A8: 4-bit codes, fp8 group scales, "
            "ConvRot) is not supported by this loader; dequantize the file to bf16 first or load the HF folder",
        )
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    group = conf.get("group_size", params.get("group_size", 16))  # ComfyUI's defaults
    rot = conf.get("convrot_groupsize", params.get("convrot_groupsize", 256))
    if weight not in header or header[weight][0] != "I8" or len(header[weight][1]) != 2:
        found = header.get(weight, ("absent", []))
        raise CheckpointError(
            path,
            f"{key}: W4A8 marker for '{weight}', which is {found[0]} {found[1]}, not 2-d int8 (packed codes)",
        )
    rows, cols = header[weight][1][0], header[weight][1][1] * 2
    if not isinstance(group, int) or group < 1 or cols % group:
        raise CheckpointError(path, f"{key}: W4A8 group_size {group!r} does not divide {cols} input columns")
    if not isinstance(rot, int) or not _is_power_of_four(rot) or cols % rot:
        raise CheckpointError(
            path,
            f"{key}: W4A8 convrot_groupsize {rot!r} is not a power of four dividing {cols} input columns",
        )
    if stem + ".weight_correction" in header:
        raise CheckpointError(
            path,
            f"{stem}.weight_correction: asymmetric W4A8 is not supported (ComfyUI's loader does not read "
            "the correction either, so no ComfyUI file carries one)",
        )

    def side(suffix: str, dtypes: set[str], shape: list[int], what: str, required: bool = True) -> str | None:
        name = stem + suffix
        if name not in header:
            if required:
                raise CheckpointError(path, f"{name}: missing ({what} of W4A8 weight '{weight}')")
            return None
        dtype, found = header[name]
        if dtype not in dtypes or math.prod(found) != math.prod(shape) or found[:1] != shape[:1]:
            raise CheckpointError(
                path,
                f"{name}: {dtype} {found}, expected {what} {sorted(dtypes)} {shape} for '{weight}' {[rows, cols]}",
            )
        return name

    s_rel = side(".weight_s_rel", {"F8_E4M3", "U8"}, [rows, cols // group], "the group scales")
    s_channel = side(".weight_s_channel", {"F32", "F16", "BF16"}, [rows], "the row scales")
    codebook = side(".weight_codebook", {"F32", "F16", "BF16"}, [16], "the 16-level codebook", required=False)
    return PackedW4A8(s_rel, codebook, group), s_channel, rot


def _scale_ok(weight_shape: list[int], scale_shape: list[int]) -> bool:
    n = 1
    for s in scale_shape:
        n *= s
    rows = weight_shape[0] if weight_shape else 1
    return n == 1 or (n == rows and all(s in (1, rows) for s in scale_shape))


def plan_quantization(
    path: str | Path,
    header: Header,
    rotations: bool = False,
    packed: bool = False,
    metadata: dict[str, str] | None = None,
) -> QuantPlan:
    """Check every quantized tensor in `header`; raise a `CheckpointError` naming any unsupported scheme.

    rotations: the caller dequantizes through `QuantPlan.dequantize`, which un-rotates ConvRot weights;
    without it a ConvRot marker is refused by name.
    packed: the caller also takes weight shapes through `QuantPlan.shape` and stored weights through
    `QuantPlan.stored` / `dequantize`, so ComfyUI W4A8 (4-bit codes, ConvRot) can be read; without it
    (or without `rotations`) a W4A8 marker is refused by name.
    metadata: the file's header metadata, whose `_quantization_metadata` may hold the markers instead.
    """
    path = Path(path)
    plan = QuantPlan(path=path)
    gptq = sorted(k for k in header if k.endswith(GPTQ_SUFFIXES))
    if gptq:
        raise CheckpointError(
            path,
            f"{gptq[0]}: GPTQ / AWQ packed weights (qweight, qzeros, scales, g_idx) are not supported; ComfyUI's "
            f"4-bit text encoders use '{W4A8_FORMAT}' (`comfy_quant` markers, `weight_s_rel`), which is read",
        )
    for key, marker in _read_markers(path, header, metadata).items():
        weight = key.removesuffix(".comfy_quant") + ".weight"
        if isinstance(marker, dict) and marker.get("format") == W4A8_FORMAT:
            allowed = packed and rotations
            plan.packed[weight], plan.scales[weight], plan.rotations[weight] = _w4a8_record(
                path, key, marker, header, allowed
            )
            continue
        group = _marker_rotation(path, key, marker, header, rotations)
        if group:
            plan.rotations[weight] = group
    plan.dropped = {k for k in header if k.endswith(DROPPED_SUFFIXES) or k in DROPPED_KEYS}
    plan.dropped |= {k.removesuffix(".weight") + s for k in plan.packed for s in W4A8_SIDE} & set(header)
    for key, (dtype, shape) in header.items():
        if key in plan.dropped or key in plan.packed or key.endswith(SCALE_SUFFIXES):
            continue
        if key.endswith(W4A8_SIDE):
            raise CheckpointError(
                path, f"{key}: W4A8 side tensor, but its weight has no '{W4A8_FORMAT}' marker"
            )
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


def decode_w4a8(
    packed: torch.Tensor, s_rel: torch.Tensor, codebook: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """ComfyUI W4A8 codes [N, K/2] (even column in the low nibble) -> its int8 grid [N, K]:
    `clamp(round(level(code) * s_rel), -127, 127)` per group of `group_size` columns, level = codebook[code]
    or code - 8 (comfy-kitchen's `_dequant_int4_grouped_to_int8`)."""
    rows = packed.shape[0]
    byte = packed.to(torch.int32) & 0xFF
    codes = torch.stack((byte & 0xF, byte >> 4), dim=-1).reshape(rows, -1)
    levels = codebook.float()[codes.long()] if codebook is not None else (codes - 8).float()
    scale = s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel
    grid = levels.reshape(rows, -1, group_size) * scale.float().reshape(rows, -1, 1)
    return grid.reshape(rows, -1).round().clamp(-127, 127).to(torch.int8)


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group_size: int = 0
) -> torch.Tensor:
    """`weight * scale` in float32 (scale per tensor or per row), un-rotated per `group_size` input
    columns when ConvRot (0: not rotated), then cast to `dtype`."""
    s = scale.float().reshape(-1)
    s = s.reshape(-1, *([1] * (weight.dim() - 1))) if s.numel() > 1 else s.reshape(())
    w = weight.float() * s
    return (unrotate(w, group_size) if group_size else w).to(dtype)
