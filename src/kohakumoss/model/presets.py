"""Named MossConfig presets.

moss-image-5b: 42 blocks (public), d 3072 = 24 heads x 128, SwiGLU 8192 (fused gate_up: 2 x 8192 rows),
text 4096 (Qwen3.5-9B). Per block six large matrices: q, k, v, o, gate_up, down (37.7M + 75.5M) plus a
256 -> 6d AdaLN modulation (4.7M): 118M per block, about 4.97B in all. docs/concepts/model.md says why.
tiny: a few million parameters, for CPU tests and the demo (text_dim matches the tiny text encoder).
"""

from __future__ import annotations

from kohakumoss_common.errors import ConfigError

from .config import MossConfig

PRESETS: dict[str, MossConfig] = {
    "moss-image-5b": MossConfig(),
    "tiny": MossConfig(
        dim=256,
        depth=4,
        num_heads=4,
        head_dim=64,
        mlp_hidden=512,
        text_dim=32,  # the tiny Qwen3.5 text encoder's hidden size
        time_freq_dim=64,
        mod_dim=64,
        rope_axes=(16, 24, 24),
    ),
}


def get_preset(name: str) -> MossConfig:
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset '{name}'; known: {sorted(PRESETS)}")
    return PRESETS[name]
