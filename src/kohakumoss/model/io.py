"""Backbone checkpoints: detect the layout, infer the config, stream-load with a dtype cast, save.

Loading builds the model on the meta device and fills it one tensor at a time, so a 5B checkpoint
never exists twice (and never as a full fp32 copy) in host memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import iter_tensors, read_header, resolve_files, save_sharded, set_module_tensor
from kohakumoss_common.log import get_logger
from kohakumoss_common.quant import QuantPlan, dequantize, plan_quantization

from .backbone import MossBackbone
from .config import MossConfig
from .layouts import LAYOUTS, KeyLayout

log = get_logger(__name__)

CONFIG_METADATA_KEY = "kohakumoss_config"
LAYOUT_METADATA_KEY = "kohakumoss_layout"
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# key suffixes that quantized checkpoints carry next to their weights
_QUANT_MARKERS = (
    "comfy_quant",
    "scale_weight",
    "weight_scale",
    "scale_input",
    "input_scale",
    "absmax",
    "quant_state",
    "quant_map",
    "weight_scale_2",
    "convrot",
    "qweight",
    "qzeros",
)


def _quantization_scheme(entries: dict[str, tuple[str, list[int]]], metadata: dict[str, str]) -> str | None:
    """Name what makes a file quantized (None when it is plain float)."""
    for key in sorted(entries):
        last = key.rsplit(".", 1)[-1]
        if last in _QUANT_MARKERS or any(m in key for m in ("comfy_quant", "convrot")):
            return f"quantization tensors like '{key}' ({entries[key][0]})"
    for key, (dtype, _) in sorted(entries.items()):
        if dtype not in _FLOAT_DTYPES:
            return f"{dtype} weights (first: '{key}')"
    for k in metadata:
        if "quant" in k.lower():
            return f"metadata key '{k}' = {metadata[k][:80]!r}"
    return None


def detect_layout(keys: set[str]) -> KeyLayout:
    for layout in LAYOUTS.values():
        if layout.matches(keys):
            return layout
    sample = sorted(keys)[:8]
    raise CheckpointError(
        "<checkpoint>", f"keys match no known layout ({sorted(LAYOUTS)}); first keys: {sample}"
    )


def _config_from_json_file(path: Path) -> dict | None:
    folder = path if path.is_dir() else path.parent
    cfg_file = folder / "config.json"
    if cfg_file.exists():
        data = json.loads(cfg_file.read_text())
        known = set(MossConfig.__dataclass_fields__)
        return {k: v for k, v in data.items() if k in known}
    return None


def infer_config(shapes: dict[str, list[int]], hints: dict | None = None) -> MossConfig:
    """Rebuild MossConfig from native key -> shape; fields shapes cannot tell come from `hints`."""
    hints = dict(hints or {})
    try:
        dim, in_channels = shapes["img_in.weight"]
        text_dim = shapes["txt_in.weight"][1]
        mod_dim = shapes["blocks.0.modulation.weight"][1]
        time_freq_dim = shapes["time_embed.linear_1.weight"][1]
    except KeyError as e:
        raise CheckpointError("<checkpoint>", f"cannot infer the config: key {e} is missing") from e
    depth = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k)))
    if "blocks.0.attn.q_norm.weight" in shapes:
        head_dim = shapes["blocks.0.attn.q_norm.weight"][0]
    else:
        head_dim = hints.get("head_dim", 128)
    up_rows = shapes.get("blocks.0.mlp.gate_up_proj.weight", [0])[0]
    if up_rows and up_rows == 2 * shapes["blocks.0.mlp.down_proj.weight"][1]:
        mlp_act, mlp_hidden = "swiglu", up_rows // 2
    else:
        mlp_act, mlp_hidden = hints.get("mlp_act", "gelu_tanh"), shapes["blocks.0.mlp.down_proj.weight"][1]
    fields = dict(
        dim=dim,
        depth=depth,
        num_heads=dim // head_dim,
        head_dim=head_dim,
        mlp_hidden=mlp_hidden,
        mlp_act=mlp_act,
        in_channels=in_channels,
        text_dim=text_dim,
        time_freq_dim=time_freq_dim,
        mod_dim=mod_dim,
        qk_norm="blocks.0.attn.q_norm.weight" in shapes,
        qkv_bias="blocks.0.attn.q_proj.bias" in shapes,
        text_norm="txt_norm.weight" in shapes,
    )
    quarter = head_dim // 4 // 2 * 2
    rest = (head_dim - quarter) // 2 // 2 * 2
    fields["rope_axes"] = tuple(hints.get("rope_axes", (quarter, rest, head_dim - quarter - rest)))
    for name in ("rope_theta", "norm_eps", "time_scale"):
        if name in hints:
            fields[name] = hints[name]
    return MossConfig(**fields)


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
    return path


def _quant_plan(path: Path, entries: dict, metadata: dict[str, str]) -> QuantPlan:
    """Weight-only scaled int8 / fp8 tensors (ComfyUI's formats) planned for dequantization at load;
    any other scheme (bitsandbytes, GPTQ, ConvRot, block-wise scales) refused by name."""
    plan = plan_quantization(path, entries)
    rest = {k: v for k, v in entries.items() if k not in plan.dropped and k not in plan.scales}
    scheme = _quantization_scheme(rest, {} if plan.scales else metadata)
    if scheme is not None:
        raise CheckpointError(
            path,
            f"unsupported quantization scheme: {scheme}. Use a bf16/fp16/fp32 checkpoint, or a "
            "weight-only int8 / fp8 one with per-tensor or per-row scales.",
        )
    return plan


def _inspect(path: Path) -> tuple[KeyLayout, MossConfig, dict[str, tuple[str, list[int]]], QuantPlan]:
    entries, metadata = read_header(path)
    plan = _quant_plan(path, entries, metadata)
    entries = {k: v for k, v in entries.items() if k not in plan.dropped}  # scales and markers
    layout = LAYOUTS.get(metadata.get(LAYOUT_METADATA_KEY, "")) or detect_layout(set(entries))
    hints = _config_from_json_file(Path(path)) or {}
    if CONFIG_METADATA_KEY in metadata:
        hints.update(json.loads(metadata[CONFIG_METADATA_KEY]))
    shapes = layout.native_shapes({k: s for k, (_, s) in entries.items()})
    return layout, infer_config(shapes, hints), entries, plan


def inspect_checkpoint(path: str | Path) -> tuple[KeyLayout, MossConfig, dict[str, tuple[str, list[int]]]]:
    """(layout, config, {file key: (dtype, shape)}) from headers only; raises on unsupported quantization
    (weight-only scaled int8 / fp8 files are read, their scale tensors left out of the entries)."""
    return _inspect(find_dit(path))[:3]


def _native_stream(
    path: str | Path, layout: KeyLayout, plan: QuantPlan
) -> Iterator[tuple[str, torch.Tensor]]:
    """The file's tensors under native keys, quantized weights dequantized (float32) as they stream."""
    scales = dict(iter_tensors(path, keys=set(plan.scales.values()))) if plan.scales else {}

    def plain(key: str, t: torch.Tensor) -> torch.Tensor:
        return dequantize(t, scales[plan.scales[key]], torch.float32) if key in plan.scales else t

    stream = ((k, plain(k, t)) for k, t in iter_tensors(path) if k not in plan.dropped)
    return layout.to_native(stream)


def load_backbone(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    config: MossConfig | None = None,
    strict: bool = True,
    ops=None,
) -> MossBackbone:
    """Load a backbone from a file, index json or folder in any known layout (or a models folder)."""
    path = find_dit(path)
    layout, inferred, _, quant = _inspect(path)
    if quant.scales:
        log.info(f"{path}: {len(quant.scales)} weight-only int8 / fp8 tensors, dequantized at load")
    config = config or inferred
    with torch.device("meta"):
        model = MossBackbone(config, ops=ops)
    expected = {k: tuple(p.shape) for k, p in model.named_parameters()}
    seen, unexpected = set(), []
    for key, tensor in _native_stream(path, layout, quant):
        if key not in expected and key.endswith("mlp.gate_up_proj.weight"):
            key = key.replace("gate_up_proj", "up_proj")  # layouts that name both MLP kinds alike
        if key not in expected:
            unexpected.append(key)
            continue
        if tuple(tensor.shape) != expected[key]:
            raise CheckpointError(
                path, f"shape mismatch for '{key}': checkpoint {tuple(tensor.shape)} vs model {expected[key]}"
            )
        set_module_tensor(model, key, tensor.to(device=device, dtype=dtype))
        seen.add(key)
    missing = sorted(set(expected) - seen)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {missing[:20]}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {sorted(unexpected)[:20]}")
        raise CheckpointError(
            path, f"does not match the {layout.name} layout of this config; " + "; ".join(parts)
        )
    if missing:  # non-strict: leave the rest randomly initialised on the target device
        for key in missing:
            set_module_tensor(
                model, key, torch.empty(expected[key], device=device, dtype=dtype).normal_(0, 0.02)
            )
    return model


def save_backbone(
    model_or_state: MossBackbone | dict[str, torch.Tensor],
    directory: str | Path,
    layout: str = "native",
    config: MossConfig | None = None,
    dtype: torch.dtype | None = None,
    prefix: str | None = None,
    max_shard_bytes: int = 5 << 30,
) -> list[Path]:
    """Write the backbone in `layout` (sharded with an index above max_shard_bytes), config in metadata."""
    if isinstance(model_or_state, MossBackbone):
        config = config or model_or_state.config
        state = {k: v.detach() for k, v in model_or_state.state_dict().items()}
    else:
        state = model_or_state
    if config is None:
        raise ValueError("save_backbone needs a config when given a bare state dict")
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    if layout not in LAYOUTS:
        raise CheckpointError(directory, f"unknown layout '{layout}'; known: {sorted(LAYOUTS)}")
    out = LAYOUTS[layout].from_native(state)
    metadata = {CONFIG_METADATA_KEY: config.to_json(), LAYOUT_METADATA_KEY: layout, "format": "pt"}
    default_prefix = {"hf": "diffusion_pytorch_model", "comfy": "moss_image"}.get(layout, "model")
    paths = save_sharded(out, directory, prefix or default_prefix, max_shard_bytes, metadata)
    if layout == "hf":
        cfg = {"_class_name": "MossImageTransformer2DModel", **config.to_dict()}
        (Path(directory) / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return paths


def checkpoint_files(path: str | Path) -> list[Path]:
    return resolve_files(path)
