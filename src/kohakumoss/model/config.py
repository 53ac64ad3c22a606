"""MossConfig: every structural choice of the backbone, as one frozen dataclass."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from kohakumoss_common.errors import ConfigError

MLP_ACTS = ("swiglu", "gelu_tanh")


@dataclass(frozen=True)
class MossConfig:
    dim: int = 3072  # hidden size of the single stream
    depth: int = 42  # transformer blocks
    num_heads: int = 24
    head_dim: int = 128
    mlp_hidden: int = 8192  # SwiGLU inner width (gate and up fused into one matrix of 2x this)
    mlp_act: str = "swiglu"  # "swiglu" (fused gate_up) or "gelu_tanh" (up, gelu, down)
    in_channels: int = 128  # 2x2-patchified FLUX.2 latents: 32 channels x 4
    text_dim: int = 4096  # text encoder hidden size (Qwen3.5-9B)
    time_freq_dim: int = 256  # sinusoidal features of the timestep
    mod_dim: int = 256  # timestep embedding width that feeds every block's AdaLN
    time_scale: float = 1000.0  # sigma in [0, 1] is scaled by this before the sinusoids
    rope_axes: tuple[int, int, int] = (32, 48, 48)  # head dims for (text index, row, column)
    rope_theta: float = 10000.0
    qk_norm: bool = True
    qkv_bias: bool = False
    text_norm: bool = True  # RMSNorm (with weight) on text hidden states before their projection
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "rope_axes", tuple(int(a) for a in self.rope_axes))
        self.validate()

    def validate(self) -> None:
        if self.num_heads * self.head_dim != self.dim:
            raise ConfigError(
                "num_heads", f"num_heads x head_dim = {self.num_heads * self.head_dim} != dim {self.dim}"
            )
        if len(self.rope_axes) != 3 or sum(self.rope_axes) != self.head_dim:
            raise ConfigError(
                "rope_axes", f"{self.rope_axes} must be 3 even sizes summing to head_dim {self.head_dim}"
            )
        if any(a % 2 for a in self.rope_axes):
            raise ConfigError("rope_axes", f"{self.rope_axes}: every axis size must be even")
        if self.mlp_act not in MLP_ACTS:
            raise ConfigError("mlp_act", f"'{self.mlp_act}' is not one of {MLP_ACTS}")
        for f in (
            "dim",
            "depth",
            "num_heads",
            "head_dim",
            "mlp_hidden",
            "in_channels",
            "text_dim",
            "mod_dim",
        ):
            if getattr(self, f) <= 0:
                raise ConfigError(f, f"must be positive, got {getattr(self, f)}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope_axes"] = list(self.rope_axes)
        return d

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
