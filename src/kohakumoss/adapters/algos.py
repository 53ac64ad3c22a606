"""The adapter algorithms: user-facing names mapped to a LyCORIS algo and its fixed arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from kohakumoss_common.errors import ConfigError


@dataclass(frozen=True)
class Algo:
    lycoris: str  # the `algo` name create_lycoris knows
    fixed: dict = field(default_factory=dict)  # arguments that define the variant (DoRA = LoRA + dora_wd)
    has_rank: bool = True  # IA3 and the OFTs read `rank` as a block size / ignore it
    note: str = ""


ALGOS: dict[str, Algo] = {
    "lora": Algo("lora"),
    "locon": Algo("locon"),
    "loha": Algo("loha"),
    "lokr": Algo("lokr"),
    "dora": Algo("lora", {"dora_wd": True}),
    "oft": Algo("diag-oft", note="rank = OFT block size"),
    "diag-oft": Algo("diag-oft", note="rank = OFT block size"),
    "boft": Algo("boft", note="rank = butterfly block factor"),
    "glora": Algo("glora"),
    "ia3": Algo("ia3", has_rank=False),
    "dylora": Algo("dylora", note="rank must be a multiple of block_size (default 4)"),
    "tlora": Algo("tlora", note="SVD init from the base weights; timestep rank mask via adapters.tlora"),
}
ALIASES = {"t-lora": "tlora", "lycoris-lora": "lora", "loraplus": "lora", "dylora-lora": "dylora"}


def resolve_algo(name: str) -> tuple[str, Algo]:
    """(canonical name, Algo) or a ConfigError naming the ALGO knob."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ALGOS:
        raise ConfigError("ALGO", f"unknown algorithm '{name}'; known: {sorted(ALGOS)}")
    return key, ALGOS[key]


def base_precision_check(knobs: dict) -> str | None:
    """precision.base_precision_problem for a config's BASE_PRECISION, ALGO and ALGO_ARGS."""
    from kohakumoss.precision import base_precision_problem

    mode, name = knobs.get("BASE_PRECISION", "same"), knobs.get("ALGO", "lora")
    if mode == "same" or name == "full":
        return base_precision_problem(mode, name)
    try:
        _, algo = resolve_algo(str(name))
    except ConfigError:
        return None  # an unknown ALGO is named by its own check
    dora = bool({**algo.fixed, **(knobs.get("ALGO_ARGS") or {})}.get("dora_wd"))
    return base_precision_problem(mode, name, algo.lycoris, dora)
