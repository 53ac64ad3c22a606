"""Backbone checkpoints: find the DiT, detect the layout, infer the config, stream-load with a dtype cast, save.

Reads the HF / diffusers tree (a folder with `model_index.json` and `transformer/`, the `transformer/`
folder itself, its index json, one of its files), ComfyUI files (a `models/` folder holding
`diffusion_models/`, or the file) and their weight-only int8 / fp8 / ConvRot int8 versions (dequantized
at load, `kohakumoss_common.quant`). Loading builds the model on the meta device, checks every key and
shape against it from the headers (one error naming the file, the keys and the layout), then fills it
one tensor at a time, so a 5B checkpoint never exists twice (and never as a full fp32 copy) in host
memory. `rope.bands` is a derived constant: never required, always recomputed in float32.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import (
    atomic_write_json,
    iter_tensors,
    read_header,
    resolve_files,
    save_safetensors,
    save_sharded,
    set_module_tensor,
)
from kohakumoss_common.log import get_logger
from kohakumoss_common.quant import QuantPlan, plan_quantization

from .backbone import MossBackbone
from .config import HF_CONFIG_FIELDS, MossConfig
from .layouts import DETECTION_ORDER, LAYOUTS, KeyLayout
from .rope import rope_bands

log = get_logger(__name__)

CONFIG_METADATA_KEY = "kohakumoss_config"
LAYOUT_METADATA_KEY = "kohakumoss_layout"
HF_CLASS_NAME = "MOSSImageTransformer"  # transformer/config.json's _class_name (model_index.json names it)
HF_FILE_PREFIX = "diffusion_pytorch_model"
COMFY_FILE_PREFIX = "moss_image"
DERIVED_KEYS = frozenset({"rope.bands"})  # recomputed from the config; a file may or may not hold it
# fields the tensors' shapes decide; the rest (rope_theta, time_scale, norm_eps) come from hints
SHAPE_FIELDS = ("dim", "depth", "num_heads", "mlp_hidden", "in_channels", "text_dim", "time_freq_dim")
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# key suffixes of quantization schemes that are not weight-only scaled tensors (bitsandbytes, GPTQ, ...)
_QUANT_MARKERS = ("absmax", "quant_state", "quant_map", "weight_scale_2", "qweight", "qzeros", "scales")
_OLD_NAMES = ("img_in.weight", "x_embedder.weight", "blocks.0.attn.q_proj.weight")
_MAX_LISTED = 20


@dataclass(frozen=True)
class CheckpointInfo:
    """What the headers of a DiT checkpoint say (no tensor data read except quantization markers)."""

    path: Path  # the resolved checkpoint: a file, an index json or a folder
    layout: KeyLayout
    config: MossConfig
    entries: dict[str, tuple[str, list[int]]]  # file key -> (dtype, shape); scales and markers left out
    quant: QuantPlan
    metadata: dict[str, str]

    @property
    def files(self) -> list[Path]:
        return resolve_files(self.path)

    @property
    def native_shapes(self) -> dict[str, list[int]]:
        return self.layout.native_shapes({k: s for k, (_, s) in self.entries.items()})


# ---- finding and reading -------------------------------------------------------------------------


def find_dit(path: str | Path) -> Path:
    """The DiT inside a weights folder: ComfyUI's models/diffusion_models/*.safetensors, an HF model's
    transformer/ folder, or `path` itself when it already is a checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return path
    comfy = path / "diffusion_models"
    if comfy.is_dir():
        files = sorted(comfy.glob("*.safetensors"))
        moss = [f for f in files if "moss" in f.name.lower()] or files
        if len(moss) != 1:
            raise CheckpointError(
                comfy,
                f"expected one MOSS-Image DiT file, found {[f.name for f in moss]}; name the file in WEIGHTS",
            )
        return moss[0]
    if (path / "transformer").is_dir():
        return path / "transformer"
    if (path / "model_index.json").exists():
        raise CheckpointError(path, "holds model_index.json but no transformer/ folder (the DiT)")
    return path


def _old_names_hint(keys: set[str]) -> str:
    if any(k in keys for k in _OLD_NAMES):
        return (
            " (these are the names KohakuMoss used before it took the released ones; such files are not read)"
        )
    return ""


def detect_layout(keys: set[str], path: str | Path = "<checkpoint>") -> KeyLayout:
    for layout in DETECTION_ORDER:
        if layout.matches(keys):
            return layout
    tried = ", ".join(f"{lay.name} (needs {list(lay.marker_keys)})" for lay in DETECTION_ORDER)
    raise CheckpointError(
        path,
        f"keys match no known layout; tried {tried}; first keys: {sorted(keys)[:8]}{_old_names_hint(keys)}",
    )


def _quantization_scheme(entries: dict[str, tuple[str, list[int]]], metadata: dict[str, str]) -> str | None:
    """Name what makes a file quantized beyond weight-only scales (None when it is plain float)."""
    for key in sorted(entries):
        if key.rsplit(".", 1)[-1] in _QUANT_MARKERS:
            return f"quantization tensors like '{key}' ({entries[key][0]})"
    for k in metadata:
        if "quant" in k.lower():
            return f"metadata key '{k}' = {metadata[k][:80]!r}"
    return None


def _quant_plan(path: Path, entries: dict, metadata: dict[str, str]) -> QuantPlan:
    """Weight-only scaled int8 / fp8 and ConvRot int8 tensors planned for dequantization at load;
    any other scheme (bitsandbytes, GPTQ, block-wise scales) refused by name."""
    plan = plan_quantization(path, entries, rotations=True, metadata=metadata)
    rest = {k: v for k, v in entries.items() if k not in plan.dropped and k not in plan.scales}
    scheme = _quantization_scheme(rest, {} if plan.scales else metadata)
    if scheme is not None:
        raise CheckpointError(
            path,
            f"unsupported quantization scheme: {scheme}. Use a bf16/fp16/fp32 checkpoint, or a weight-only "
            "int8 / fp8 one with per-tensor or per-row scales (ConvRot int8 included).",
        )
    return plan


def _is_moss_config(data: dict) -> bool:
    return data.get("_class_name") == HF_CLASS_NAME or bool(
        {"num_layers", "ffn_dim", "freq_dim", "latent_channels", "depth", "mlp_hidden"} & set(data)
    )


def config_hints(path: Path, metadata: dict[str, str]) -> dict[str, tuple[object, str]]:
    """MossConfig fields -> (value, where from): a `config.json` beside the weights (the released field
    names, or this project's), then the file's `kohakumoss_config` metadata (wins)."""
    hints: dict[str, tuple[object, str]] = {}
    folder = path if path.is_dir() else path.parent
    cfg_file = folder / "config.json"
    if cfg_file.exists():
        try:
            data = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(cfg_file, f"not valid json ({e})") from e
        if isinstance(data, dict) and _is_moss_config(data):
            for ours, hf in HF_CONFIG_FIELDS.items():
                if hf in data:
                    hints[ours] = (data[hf], f"{cfg_file} field '{hf}'")
            for name in MossConfig.__dataclass_fields__:
                if name in data and name not in hints:
                    hints[name] = (data[name], f"{cfg_file} field '{name}'")
    if CONFIG_METADATA_KEY in metadata:
        try:
            meta = json.loads(metadata[CONFIG_METADATA_KEY])
        except json.JSONDecodeError as e:
            raise CheckpointError(path, f"metadata '{CONFIG_METADATA_KEY}' is not valid json ({e})") from e
        for name, value in meta.items():
            if name in MossConfig.__dataclass_fields__:
                hints[name] = (value, f"metadata '{CONFIG_METADATA_KEY}'")
    return hints


def _count(shapes: dict[str, list[int]], pattern: str) -> int:
    found = {int(m.group(1)) for k in shapes if (m := re.match(pattern, k))}
    return 1 + max(found) if found else 0


def infer_config(
    shapes: dict[str, list[int]],
    hints: dict[str, tuple[object, str]] | None = None,
    path: str | Path = "<checkpoint>",
    layout: str = "hf",
) -> MossConfig:
    """MossConfig from native key -> shape; `hints` (field -> (value, source)) give what shapes cannot
    (rope_theta, time_scale, norm_eps) and must agree with what they can."""
    hints = hints or {}
    try:
        dim, in_channels = shapes["video_embedder.weight"]
        text_dim = shapes["text_embedder.proj.weight"][1]
        time_freq_dim = shapes["time_embedding.0.weight"][1]
        mlp_hidden = shapes["layers.0.proj.ffn_down.weight"][1]
        head_dim = shapes["layers.0.q_norm.weight"][0]
    except KeyError as e:
        raise CheckpointError(
            path,
            f"cannot infer the config ({layout} layout): key {e} is missing{_old_names_hint(set(shapes))}",
        ) from e
    fields = dict(
        dim=dim,
        depth=_count(shapes, r"layers\.(\d+)\."),
        num_heads=dim // head_dim,
        mlp_hidden=mlp_hidden,
        in_channels=in_channels,
        text_dim=text_dim,
        time_freq_dim=time_freq_dim,
        refiner_depth=_count(shapes, r"text_embedder\.blocks\.(\d+)\."),
    )
    for name, (value, source) in hints.items():
        if name not in fields:
            fields[name] = value
        elif value != fields[name]:
            raise CheckpointError(
                path, f"{source} says {name}={value!r}, but the tensors say {name}={fields[name]!r}"
            )
    try:
        return MossConfig(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(path, f"the inferred config {fields} is not valid: {e}") from e


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """Layout, config, entries and quantization of the DiT at `path` (any layout), from headers only."""
    path = find_dit(path)
    entries, metadata = read_header(path)
    plan = _quant_plan(path, entries, metadata)
    entries = {k: v for k, v in entries.items() if k not in plan.dropped}
    layout = detect_layout(set(entries), path)
    shapes = layout.native_shapes({k: s for k, (_, s) in entries.items()})
    config = infer_config(shapes, config_hints(path, metadata), path, layout.name)
    return CheckpointInfo(path, layout, config, entries, plan, metadata)


def inspect_checkpoint(path: str | Path) -> tuple[KeyLayout, MossConfig, dict[str, tuple[str, list[int]]]]:
    """(layout, config, {file key: (dtype, shape)}) from headers only; raises on unsupported quantization
    (quantized files are read, their scale and marker tensors left out of the entries)."""
    info = read_checkpoint(path)
    return info.layout, info.config, info.entries


# ---- checking and loading -------------------------------------------------------------------------


def _listed(keys: list[str]) -> str:
    more = f" ... and {len(keys) - _MAX_LISTED} more" if len(keys) > _MAX_LISTED else ""
    return f"{keys[:_MAX_LISTED]}{more}"


def key_problems(
    info: CheckpointInfo, expected: dict[str, tuple[int, ...]]
) -> tuple[list[str], list[str], list[str]]:
    """(missing file keys, unexpected file keys, shape / dtype mismatches) of `info` against native key -> shape."""
    layout, shapes = info.layout, info.native_shapes
    prefix = next((p for p in layout.strip_prefixes if any(k.startswith(p) for k in info.entries)), "")
    absent = (k for k in expected if k not in shapes and k not in DERIVED_KEYS)
    missing = sorted(prefix + k for k in layout.layout_keys(absent))
    unexpected = sorted(
        key
        for key in info.entries
        if any(n not in expected for n in (layout.fused_parts(key) or [layout.key_to_native(key)]))
    )
    mismatched = [
        f"'{key}': checkpoint {tuple(shape)} vs model {expected[key]}"
        for key, shape in sorted(shapes.items())
        if key in expected and tuple(shape) != expected[key]
    ]
    mismatched += [
        f"'{key}': dtype {dtype} is not a float type"
        for key, (dtype, _) in sorted(info.entries.items())
        if dtype not in _FLOAT_DTYPES and key not in info.quant.scales and key not in unexpected
    ]
    return missing, unexpected, mismatched


def check_keys(info: CheckpointInfo, config: MossConfig, strict: bool = True) -> None:
    """One CheckpointError naming the file, the layout and every missing / unexpected key (strict) and
    every shape mismatch (always), before any tensor data is read."""
    with torch.device("meta"):
        model = MossBackbone(config)
    expected = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    missing, unexpected, mismatched = key_problems(info, expected)
    parts = []
    if strict and missing:
        parts.append(f"missing keys ({len(missing)}): {_listed(missing)}")
    if strict and unexpected:
        parts.append(f"unexpected keys ({len(unexpected)}): {_listed(unexpected)}")
    if mismatched:
        parts.append(f"shape or dtype mismatch ({len(mismatched)}): {'; '.join(mismatched[:_MAX_LISTED])}")
    if parts:
        raise CheckpointError(
            info.path,
            f"does not match the {info.layout.name} layout of MossConfig(dim={config.dim}, depth={config.depth}, "
            f"refiner_depth={config.refiner_depth}): "
            + "; ".join(parts)
            + _old_names_hint(set(info.entries)),
        )


def native_tensors(
    info: CheckpointInfo, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under native keys, one at a time; quantized weights dequantized on
    `device` (through float32, un-rotated where ConvRot) to `dtype`, fused ones split."""
    plan = info.quant
    scales = dict(iter_tensors(info.path, keys=set(plan.scales.values()))) if plan.scales else {}

    def plain(key: str, t: torch.Tensor) -> torch.Tensor:
        if key not in plan.scales:
            return t
        return plan.dequantize(key, t.to(device), scales[plan.scales[key]].to(device), dtype)

    stream = ((k, plain(k, t)) for k, t in iter_tensors(info.path) if k not in plan.dropped)
    return info.layout.to_native(stream)


def load_backbone(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    config: MossConfig | None = None,
    strict: bool = True,
    ops=None,
) -> MossBackbone:
    """Load a backbone from a file, index json or folder in any known layout (or a models folder / HF tree).

    strict=False loads what matches, leaves missing tensors random (normal, std 0.02) and skips
    unexpected ones; a shape mismatch is an error either way.
    """
    info = read_checkpoint(path)
    if info.quant.scales:
        log.info(f"{info.path}: {info.quant.scheme}")
    config = config or info.config
    check_keys(info, config, strict)
    with torch.device("meta"):
        model = MossBackbone(config, ops=ops)
    expected = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    seen = set()
    for key, tensor in native_tensors(info, dtype, device):
        if key not in expected or key in DERIVED_KEYS:
            continue
        set_module_tensor(model, key, tensor.to(device=device, dtype=dtype))
        seen.add(key)
    for key in sorted(set(expected) - seen - DERIVED_KEYS):  # non-strict: the rest random
        set_module_tensor(model, key, torch.empty(expected[key], device=device, dtype=dtype).normal_(0, 0.02))
    set_module_tensor(model, "rope.bands", rope_bands(config.head_dim, config.rope_theta, device))
    return model


# ---- saving ---------------------------------------------------------------------------------------


def hf_config_json(config: MossConfig) -> dict:
    """The released `transformer/config.json` for this config."""
    return {"_class_name": HF_CLASS_NAME, **config.hf_config()}


def save_backbone(
    model_or_state: MossBackbone | dict[str, torch.Tensor],
    target: str | Path,
    layout: str = "hf",
    config: MossConfig | None = None,
    dtype: torch.dtype | None = None,
    prefix: str | None = None,
    max_shard_bytes: int = 5 << 30,
    key_prefix: str | None = None,
) -> list[Path]:
    """Write the backbone in `layout`, every file atomically; returns the weight files written.

    target: a `.safetensors` path (one file), or a folder: "hf" writes the `transformer/` folder style
    (`diffusion_pytorch_model.safetensors`, or shards above max_shard_bytes with the index, and a
    `config.json` with the released fields); "comfy" writes one `<prefix>.safetensors` (default
    moss_image) with q, k, v fused and keys under `model.diffusion_model.` (key_prefix overrides it).
    The full MossConfig and the layout go into every file's metadata.
    """
    if isinstance(model_or_state, MossBackbone):
        config = config or model_or_state.config
        state = {k: v.detach() for k, v in model_or_state.state_dict().items()}
    else:
        state = model_or_state
    if config is None:
        raise ValueError("save_backbone needs a config when given a bare state dict")
    if layout not in LAYOUTS:
        raise CheckpointError(target, f"unknown layout '{layout}'; known: {sorted(LAYOUTS)}")
    lay = LAYOUTS[layout]
    # to the host a tensor at a time, cast there: a whole model's copy on the card would not fit beside
    # the training state (the write needs every tensor on the host anyway)
    state = {
        k: v.to("cpu", dtype if dtype is not None and v.is_floating_point() else v.dtype)
        for k, v in state.items()
    }
    key_prefix = lay.save_prefix if key_prefix is None else key_prefix
    out = {key_prefix + k: v for k, v in lay.from_native(state).items()}
    metadata = {CONFIG_METADATA_KEY: config.to_json(), LAYOUT_METADATA_KEY: lay.name, "format": "pt"}
    target = Path(target)
    if target.suffix == ".safetensors":
        save_safetensors(out, target, metadata)
        return [target]
    if lay.name == "comfy":
        path = target / f"{prefix or COMFY_FILE_PREFIX}.safetensors"
        save_safetensors(out, path, metadata)
        return [path]
    paths = save_sharded(out, target, prefix or HF_FILE_PREFIX, max_shard_bytes, metadata)
    atomic_write_json(target / "config.json", hf_config_json(config))
    return paths


def checkpoint_files(path: str | Path) -> list[Path]:
    return resolve_files(find_dit(path))
