"""MossConfig: every structural choice of the backbone, as one frozen dataclass.

The fields follow the released `transformer/config.json` (dim, ffn_dim, num_heads, num_layers, text_dim,
freq_dim, latent_channels, rope_base), under this project's names; `hf_config` / `from_hf_config` convert.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from kohakumoss_common.errors import ConfigError

ROPE_AXES = 4  # (r, t, h, w): a reserved axis (always 0), the text index, the image row, the image column

# this project's field -> the released config.json's field
HF_CONFIG_FIELDS = {
    "dim": "dim",
    "mlp_hidden": "ffn_dim",
    "num_heads": "num_heads",
    "depth": "num_layers",
    "text_dim": "text_dim",
    "time_freq_dim": "freq_dim",
    "in_channels": "latent_channels",
    "rope_theta": "rope_base",
}


@dataclass(frozen=True)
class MossConfig:
    dim: int = 3072  # hidden size of the single stream
    depth: int = 42  # transformer blocks (`layers.N`)
    num_heads: int = 24  # head_dim = dim / num_heads (128)
    mlp_hidden: int = 8192  # SiTU-GLU inner width (ffn_up_gate holds 2x this rows: hidden, then gate)
    in_channels: int = 128  # 2x2-patchified FLUX.2 latents: 32 channels x 4
    text_dim: int = 4096  # text encoder hidden size (Qwen3.5-9B)
    time_freq_dim: int = 256  # sinusoidal features of the timestep
    time_scale: float = 1000.0  # sigma in [0, 1] is scaled by this before the sinusoids
    rope_theta: float = 10000.0  # band base: bands = theta^(-k / (head_dim / 8))
    refiner_depth: int = 2  # unmodulated text refiner blocks (`text_embedder.blocks.N`)
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def rope_bands(self) -> int:
        """Frequencies per rotary axis: 4 axes x bands pairs fill half of head_dim."""
        return self.head_dim // (2 * ROPE_AXES)

    @property
    def rope_axes(self) -> tuple[int, ...]:
        """Head dims per rotary axis (r, t, h, w)."""
        return (2 * self.rope_bands,) * ROPE_AXES

    def validate(self) -> None:
        for f in ("dim", "depth", "num_heads", "mlp_hidden", "in_channels", "text_dim", "time_freq_dim"):
            if getattr(self, f) <= 0:
                raise ConfigError(f, f"must be positive, got {getattr(self, f)}")
        if self.refiner_depth < 0:
            raise ConfigError("refiner_depth", f"must be >= 0, got {self.refiner_depth}")
        if self.dim % self.num_heads:
            raise ConfigError("num_heads", f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % (2 * ROPE_AXES):
            raise ConfigError(
                "num_heads", f"head_dim {self.head_dim} must be divisible by 8 (4 rotary axes of pairs)"
            )
        if self.time_freq_dim % 2:
            raise ConfigError("time_freq_dim", f"must be even, got {self.time_freq_dim}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> MossConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(unknown[0], f"unknown MossConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> MossConfig:
        return cls.from_dict(json.loads(text))

    def hf_config(self) -> dict:
        """The released `transformer/config.json` fields for this config."""
        return {hf: getattr(self, ours) for ours, hf in HF_CONFIG_FIELDS.items()}

    @classmethod
    def from_hf_config(cls, d: dict, source: str = "config.json") -> MossConfig:
        """A config from the released config.json's fields (others, like `_class_name`, ignored)."""
        kwargs = {ours: d[hf] for ours, hf in HF_CONFIG_FIELDS.items() if hf in d}
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ConfigError(source, f"cannot build a MossConfig from {kwargs}: {e}") from e
