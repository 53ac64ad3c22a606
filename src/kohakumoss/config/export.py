"""The knobs of scripts/export/export.py as one typed config, `ExportScriptConfig` (see kohakumoss_common/typed_config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss_common.knobs import Schema
from kohakumoss_common.typed_config import ScriptConfig, config_knobs, knob

from .bounds import SEED_MAX, SEED_MIN
from .train import save_format_knob


@dataclass(frozen=True)
class ExportScriptConfig(ScriptConfig):
    """Every knob of scripts/export/export.py: the adapter to re-export, the base it was trained on, the files."""

    weights: str = knob("", "base DiT checkpoint (any layout) the adapter was trained on", path="any")
    model_preset: str = knob("", "with WEIGHTS empty: random weights of this preset (tests only)")
    adapter: str = knob(
        "", "a checkpoint folder (or its trainable.safetensors), or a LyCORIS file", path="any"
    )
    out: str = knob(
        "export", "output folder, or the ComfyUI file (a .safetensors path: the others go beside it)"
    )
    name: str = knob(
        "", "file name stem in the OUT folder (default: RUN_NAME-stepXXXXX, or the adapter file's stem)"
    )
    save_format: str = save_format_knob("both")
    save_merged: bool = knob(False, "also write the merged transformer")
    merged_layout: str = knob(
        "comfy", "key layout of the merged transformer", choices=("comfy", "native", "hf")
    )
    save_diffusers: bool = knob(False, "also write a diffusers-layout transformer")
    use_ema: bool = knob(False, "export the checkpoint's EMA weights instead of the raw ones")
    dtype: str = knob("bf16", "dtype of merged / diffusers weights", choices=("bf16", "fp16", "fp32"))
    seed: int = knob(0, "seed of MODEL_PRESET's random weights", min=SEED_MIN, max=SEED_MAX)
    show_metadata: bool = knob(
        False, "print ADAPTER's metadata (ss_*, modelspec.*; a checkpoint's exports) and write nothing"
    )


EXPORT_KNOBS = config_knobs(ExportScriptConfig)
EXPORT_SCHEMA = Schema(EXPORT_KNOBS)
