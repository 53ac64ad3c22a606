"""Re-export any checkpoint later: rebuild its adapter (or full weights) onto a base model, then export.

A checkpoint folder carries its run's knobs (config.json), so its adapter is rebuilt with the same
algorithm and targets and filled with the saved trainable weights (or the EMA ones). A bare LyCORIS
file is rebuilt by lycoris from its own keys; a plain LoRA in the published kohya / PEFT / ComfyUI
styles becomes LoCon modules the same way (`adapters/foreign.py`); a ComfyUI-format file holding LoHa,
LoKr or diff entries is merged into the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from kohakumoss.adapters import build_from_spec, load_adapter
from kohakumoss.adapters.foreign import is_lora_state
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.checkpoint.state import load_trainable_state
from kohakumoss.config.train import TrainConfig
from kohakumoss.model import MossBackbone
from kohakumoss.precision import Fp8Linear, Int8Linear, Mxfp8Linear
from kohakumoss_common.errors import CheckpointError, ConfigError

from .bundle import export_all
from .comfy_apply import is_comfy_adapter, merge_comfy_adapter
from .metadata import carried, read_metadata, run_metadata


def checkpoint_folder(path: str | Path) -> Path | None:
    """The checkpoint folder behind `path` (the folder itself, or its trainable.safetensors), else None."""
    path = Path(path)
    folder = path.parent if path.name == "trainable.safetensors" else path
    return folder if (folder / "meta.json").is_file() else None


def _ema_weights(ckpt, where: Path) -> dict[str, torch.Tensor]:
    if ckpt.ema is None:
        raise CheckpointError(where, "USE_EMA is set but the checkpoint holds no EMA (the run had EMA off)")
    return ckpt.ema["shadow"]


def _refuse_fp8_merge(model: MossBackbone, source: str | Path) -> None:
    if any(isinstance(m, (Fp8Linear, Int8Linear, Mxfp8Linear)) for m in model.modules()):
        raise ConfigError(
            "BASE_PRECISION",
            f"'{source}' is merged into the DiT's weights, which are stored in fp8 / int8 here; "
            "use BASE_PRECISION='same' with it (LyCORIS files run beside an fp8 or int8 base)",
        )


def attach(model: MossBackbone, source: str | Path, use_ema: bool = False, multiplier: float = 1.0):
    """Put the adapter or full weights of `source` on `model`; returns (network or None, default name)."""
    folder = checkpoint_folder(source)
    if folder is None:
        if use_ema:
            raise CheckpointError(source, "USE_EMA needs a checkpoint folder, not a bare adapter file")
        tensors = load_file(str(source))
        if is_comfy_adapter(tensors) and not is_lora_state(tensors):  # LoHa / LoKr / diff entries
            _refuse_fp8_merge(model, source)
            merge_comfy_adapter(model, tensors, multiplier)
            return None, Path(source).stem
        return load_adapter(model, source, multiplier=multiplier), Path(source).stem
    ckpt = load_checkpoint(folder)
    # the run's adapter as the trainer built it; knobs an older run's config.json lacks take their defaults
    adapter = TrainConfig.from_knobs(ckpt.config).adapter
    weights = _ema_weights(ckpt, folder) if use_ema else ckpt.trainable
    name = f"{ckpt.config.get('RUN_NAME', 'moss')}-step{ckpt.step:05d}"
    if adapter.algo == "full":
        _refuse_fp8_merge(model, source)
        model.requires_grad_(True)
        load_trainable_state(model, {n: w for n, w in weights.items()}, folder)
        model.requires_grad_(False)
        return None, name
    network = build_from_spec(model, adapter.spec(multiplier, dropouts=False))
    network.to(dtype=torch.float32)
    load_trainable_state(network, weights, folder)
    network.requires_grad_(False)
    return network, name


def source_metadata(source: str | Path) -> dict[str, str]:
    """What a re-export of `source` writes as metadata: a file's own (less its format keys); for a
    checkpoint, its run's keys at its step, overlaid with what the checkpoint's exports carried."""
    folder = checkpoint_folder(source)
    if folder is None:
        return carried(read_metadata(source))
    config = json.loads((folder / "config.json").read_text())
    step = int(json.loads((folder / "meta.json").read_text())["step"])
    if config.get("ALGO") == "full" or "RUN_NAME" not in config:
        return {}
    meta = run_metadata(config, step, folder.parent.parent)  # checkpoints/step_N -> the run folder
    adapters = [
        *(folder / "export").glob("*.safetensors"),
        *(folder / "export" / "lycoris").glob("*.safetensors"),
    ]
    for path in sorted(adapters)[:1]:  # the ComfyUI file, or the LyCORIS file in its subfolder
        meta.update(carried(read_metadata(path)))
    return meta


def export_checkpoint(
    model: MossBackbone,
    source: str | Path,
    out: str | Path,
    name: str,
    merged: bool,
    merged_layout: str,
    diffusers: bool,
    use_ema: bool,
    dtype: torch.dtype,
    save_format: str,
) -> dict[str, Path]:
    """Export `source` (a checkpoint folder or an adapter file) on `model` into `out`: a folder, or the
    ComfyUI file with the others beside it (`bundle.export_paths`)."""
    network, default_name = attach(model, source, use_ema)
    return export_all(
        model,
        network,
        out,
        name or default_name,
        save_merged_model=merged,
        merged_layout=merged_layout,
        save_diffusers=diffusers,
        dtype=dtype,
        metadata=source_metadata(source) if network is not None else None,
        save_format=save_format,
    )


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
