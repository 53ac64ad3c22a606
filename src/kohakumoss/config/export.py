"""The knobs of scripts/export/export.py."""

from __future__ import annotations

from .knobs import Knob, Schema

EXPORT_KNOBS = [
    Knob("WEIGHTS", "", "base DiT checkpoint (any layout) the adapter was trained on", path="any"),
    Knob("MODEL_PRESET", "", "with WEIGHTS empty: random weights of this preset (tests only)"),
    Knob("ADAPTER", "", "a checkpoint folder (or its trainable.safetensors), or a LyCORIS file", path="any"),
    Knob("OUT", "export", "output folder"),
    Knob("NAME", "", "file name stem (default: RUN_NAME-stepXXXXX, or the adapter file's stem)"),
    Knob("SAVE_MERGED", False, "also write the merged transformer"),
    Knob("MERGED_LAYOUT", "comfy", "key layout of the merged transformer", choices=("comfy", "native", "hf")),
    Knob("SAVE_DIFFUSERS", False, "also write a diffusers-layout transformer"),
    Knob("USE_EMA", False, "export the checkpoint's EMA weights instead of the raw ones"),
    Knob("DTYPE", "bf16", "dtype of merged / diffusers weights", choices=("bf16", "fp16", "fp32")),
    Knob("SEED", 0, "seed of MODEL_PRESET's random weights"),
    Knob(
        "SHOW_METADATA",
        False,
        "print ADAPTER's metadata (ss_*, modelspec.*; a checkpoint's exports) and write nothing",
    ),
]

EXPORT_SCHEMA = Schema(EXPORT_KNOBS)
