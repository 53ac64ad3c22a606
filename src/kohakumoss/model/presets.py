"""Named MossConfig presets.

moss-image-5b: the released MOSS-Image-Base / -SFT transformer: 42 blocks of d 3072 (24 heads x 128), SiTU-GLU
8192, text 4096 (Qwen3.5-9B), two text refiner blocks, one shared block modulation: 463 tensors,
5,082,308,608 parameters (docs/concepts/model.md).
tiny: the same structure at small widths, for CPU tests and the demo (text_dim matches the tiny text encoder).
"""

from __future__ import annotations

from kohakumoss_common.errors import ConfigError

from .config import MossConfig

PRESETS: dict[str, MossConfig] = {
    "moss-image-5b": MossConfig(),
    "tiny": MossConfig(
        dim=256,
        depth=4,
        num_heads=4,  # head_dim 64: 4 rotary axes x 8 bands
        mlp_hidden=512,
        text_dim=32,  # the tiny Qwen3.5 text encoder's hidden size
        time_freq_dim=64,
    ),
}


def get_preset(name: str) -> MossConfig:
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset '{name}'; known: {sorted(PRESETS)}")
    return PRESETS[name]
