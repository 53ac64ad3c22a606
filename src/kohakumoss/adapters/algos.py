"""The adapter algorithms: user-facing names mapped to a LyCORIS algo and its fixed arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kohakumoss_common.errors import ConfigError

if TYPE_CHECKING:
    from .config import AdapterConfig


@dataclass(frozen=True)
class Algo:
    lycoris: str  # the `algo` name create_lycoris knows
    fixed: dict = field(default_factory=dict)  # arguments that define the variant (DoRA = LoRA + dora_wd)
    has_rank: bool = True  # IA3 and the OFTs read `rank` as a block size / ignore it
    note: str = ""
    # lycoris's bypass forward (base output + adapter output) computes the merged-weight forward's function
    # on every linear (tests/adapters/test_options.py measures it); the OFTs and IA3 also transform a linear's
    # bias there, DyLoRA's drops its scale
    bypass_same: bool = True

    def bypass(self, asked: bool | str, args: dict) -> bool:
        """The forward BYPASS asks for (True: bypass): True / False as set; 'auto' the bypass forward where it
        computes the merged one's function (the fused LoRA kernels run only there), else the merged one.
        `args`: the adapter's lycoris arguments (DoRA's weight decomposition is merged-only)."""
        if asked != "auto":
            return bool(asked)
        return self.bypass_same and not {**self.fixed, **args}.get("dora_wd")


ALGOS: dict[str, Algo] = {
    "lora": Algo("lora"),
    "locon": Algo("locon"),
    "loha": Algo("loha"),
    "lokr": Algo("lokr"),
    "dora": Algo("lora", {"dora_wd": True}),
    "oft": Algo("diag-oft", note="rank = OFT block size", bypass_same=False),
    "diag-oft": Algo("diag-oft", note="rank = OFT block size", bypass_same=False),
    "boft": Algo("boft", note="rank = butterfly block factor", bypass_same=False),
    "glora": Algo("glora"),
    "ia3": Algo("ia3", has_rank=False, bypass_same=False),
    "dylora": Algo("dylora", note="rank must be a multiple of block_size (default 4)", bypass_same=False),
    "tlora": Algo("tlora", note="SVD init from the base weights; timestep rank mask via adapters.tlora"),
}
BYPASS_CHOICES = ("auto", True, False)
ALIASES = {"t-lora": "tlora", "lycoris-lora": "lora", "loraplus": "lora", "dylora-lora": "dylora"}


def resolve_algo(name: str) -> tuple[str, Algo]:
    """(canonical name, Algo) or a ConfigError naming the ALGO knob."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ALGOS:
        raise ConfigError("ALGO", f"unknown algorithm '{name}'; known: {sorted(ALGOS)}")
    return key, ALGOS[key]


def base_precision_check(adapter: AdapterConfig, mode: str) -> str | None:
    """precision.base_precision_problem for BASE_PRECISION=`mode` under this adapter (ALGO, ALGO_ARGS)."""
    from kohakumoss.precision import base_precision_problem

    name = adapter.algo
    if mode == "same" or name == "full":
        return base_precision_problem(mode, name)
    try:
        _, algo = resolve_algo(str(name))
    except ConfigError:
        return None  # an unknown ALGO is named by its own check
    dora = bool({**algo.fixed, **(adapter.algo_args or {})}.get("dora_wd"))
    return base_precision_problem(mode, name, algo.lycoris, dora)


def trained_forward(knobs: dict) -> bool | str | None:
    """What a config's BYPASS decides about the trained function, as resume compares it: None where
    lycoris's bypass and merged forwards compute one function (either resumes the other: only the rounding
    differs) or there is no adapter, else the forward BYPASS picks."""
    name, asked = str(knobs.get("ALGO", "lora")), knobs.get("BYPASS", "auto")
    if name == "full":
        return None
    try:
        _, algo = resolve_algo(name)
    except ConfigError:
        return asked  # an unknown ALGO is named by its own check
    args = dict(knobs.get("ALGO_ARGS") or {})
    return None if algo.bypass("auto", args) else algo.bypass(asked, args)
