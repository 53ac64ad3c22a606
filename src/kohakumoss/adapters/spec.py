"""AdapterSpec: everything needed to rebuild an adapter network, stored in every saved adapter file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from kohakumoss_common.errors import ConfigError

from .algos import BYPASS_CHOICES, resolve_algo

SPEC_METADATA_KEY = "kohakumoss_adapter"


@dataclass(frozen=True)
class AdapterSpec:
    algo: str = "lora"
    rank: int = 16
    alpha: float = 16.0
    preset: str = "attn-mlp"  # attn | attn-mlp | full | custom
    patterns: tuple[str, ...] = ()  # module name regexes or globs for preset 'custom'
    dropout: float = 0.0
    rank_dropout: float = 0.0
    module_dropout: float = 0.0
    # True: y = Wx + adapter(x); False: y = (W + dW)x; 'auto': True where both are one function (Algo.bypass)
    bypass: bool | str = "auto"
    multiplier: float = 1.0
    algo_args: dict = field(default_factory=dict)  # passed to create_lycoris (factor, block_size, ...)

    def __post_init__(self) -> None:
        name, _ = resolve_algo(self.algo)
        object.__setattr__(self, "algo", name)
        object.__setattr__(self, "patterns", tuple(self.patterns))
        if self.bypass not in BYPASS_CHOICES or not isinstance(self.bypass, (bool, str)):
            raise ConfigError("BYPASS", f"must be one of {list(BYPASS_CHOICES)}, got {self.bypass!r}")
        if self.rank <= 0:
            raise ConfigError("RANK", f"must be > 0, got {self.rank}")
        for knob in ("dropout", "rank_dropout", "module_dropout"):
            if not 0.0 <= getattr(self, knob) < 1.0:
                raise ConfigError(knob.upper(), f"must be in [0, 1), got {getattr(self, knob)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AdapterSpec:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
