"""The adapter algorithms: one `Algo` record per user-facing name, holding every fact the rest of the
project needs about it (the LyCORIS module and its fixed arguments, which dropouts each forward applies,
whether it runs beside a quantized base, its kernel path, its per-step hook, what it saves for the
backward, why CUDA graphs or DISTRIBUTED refuse it). Nothing outside this file names an algorithm.

Adding an algorithm (one LyCORIS already has):
1. an `ALGOS` entry here, its facts measured: tests/adapters/test_knobs.py checks `dropouts` against
   lycoris, tests/adapters/test_options.py `bypass_same`, tests/export/test_verify.py the exports
   (every test iterates `ALGOS`);
2. a preset layer `configs/moss/algo/<name>.py` (tests/cli/test_config_tool.py wants one per algorithm);
3. only if lycoris's forward needs Python state each step: a `StepHook` (adapters/tlora.py's is the model).
docs/concepts/adapters.md walks through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kohakumoss_common.errors import ConfigError

from .tlora import clear_tlora_mask, set_tlora_sigma

if TYPE_CHECKING:
    from .config import AdapterConfig

DROPOUT_KNOBS = ("dropout", "rank_dropout", "module_dropout")
_ALL = frozenset(DROPOUT_KNOBS)
_RANK_MODULE = frozenset({"rank_dropout", "module_dropout"})
_MODULE = frozenset({"module_dropout"})
_NONE: frozenset = frozenset()
_INPUT_MODULE = frozenset({"dropout", "module_dropout"})

# lycoris's modules keep, per token and wrapped block linear, this many fan_in-wide values in the compute
# precision for their own backward (the linear's input). lokr: MEASURED on the H200, 2026-12-02,
# `user_runs.py --rows whole/lokr/2` (r32 on every linear, bypass, lycoris's torch backend after its fused
# kernels faulted): step peak 69.5 GiB against the same plan's LoRA 54.0 GiB, i.e. 1.02 x 23,552 fan_in
# values per token and block over 42 blocks at ~8,230 tokens. The other algorithms: PLACEHOLDER (lokr's).
LYCORIS_SAVED_PER_FAN_IN = 1.0


@dataclass(frozen=True)
class StepHook:
    """Python state an algorithm's forward reads, set before each training micro-step and undone for
    sampling and exports."""

    before: Callable[[torch.Tensor, int], None]  # (the micro-step's sigmas, RANK)
    reset: Callable[[], None]


@dataclass(frozen=True)
class Algo:
    lycoris: str  # the `algo` name create_lycoris knows
    fixed: dict = field(default_factory=dict)  # arguments that define the variant (DoRA = LoRA + dora_wd)
    has_rank: bool = True  # IA3 reads no rank
    note: str = ""
    # RANK is a block size over the output features (the OFTs), else at most min(in, out) features
    rank_on_outputs: bool = False
    # lycoris's bypass forward (base output + adapter output) computes the merged-weight forward's function
    # on every linear (tests/adapters/test_options.py measures it); the OFTs and IA3 also transform a linear's
    # bias there, DyLoRA's drops its scale
    bypass_same: bool = True
    bypass_refused: str = ""  # why BYPASS=True is refused (lycoris computes it wrongly)
    # the dropout knobs lycoris 4.1.3 applies in (its merged-weight forward, its bypass forward): measured
    # by tests/adapters/test_knobs.py, adapters/dropouts.py decides with them
    dropouts: tuple[frozenset, frozenset] = (_RANK_MODULE, _ALL)
    # runs beside a weight-only fp8 / int8 linear (bypass, never reading the weight: LyCORIS's
    # _FP8_BYPASS_ALGOS); with DoRA's weight norm too only where `quantized_dora` (LoKr)
    quantized_base: bool = False
    quantized_dora: bool = False
    # LoRA and LoCon run the project's kernels (ops.lora_linear); the rest lycoris's (kernel_probe.py)
    project_kernels: bool = False
    saved_per_fan_in: float = LYCORIS_SAVED_PER_FAN_IN  # see above; 0 on the project's kernels
    up_params: tuple[str, ...] = ()  # parameter-name markers of its output-side factors (LoRA+'s up group)
    step_hook: StepHook | None = None
    # its forward reads Python state set per step (T-LoRA's mask, DyLoRA's drawn rank): no CUDA graph
    python_state: bool = False
    distributed_refusal: str = ""  # why DISTRIBUTED cannot run it

    def dora(self, args: dict | None = None) -> bool:
        """Whether it trains DoRA's weight decomposition with these lycoris arguments."""
        return bool({**self.fixed, **(args or {})}.get("dora_wd"))

    def bypass(self, asked: bool | str, args: dict) -> bool:
        """The forward BYPASS asks for (True: bypass): True / False as set; 'auto' the bypass forward where it
        computes the merged one's function (the fused LoRA kernels run only there), else the merged one.
        `args`: the adapter's lycoris arguments (DoRA's weight decomposition is merged-only)."""
        if asked != "auto":
            return bool(asked)
        return self.bypass_same and not self.dora(args)

    def runs_on_quantized_base(self, args: dict) -> bool:
        return self.quantized_base and (self.quantized_dora or not self.dora(args))


_LORA_UP = ("lora_up",)
_OFT = {"note": "rank = OFT block size", "bypass_same": False, "rank_on_outputs": True}
ALGOS: dict[str, Algo] = {
    "lora": Algo("lora", quantized_base=True, project_kernels=True, saved_per_fan_in=0.0, up_params=_LORA_UP),
    "locon": Algo(
        "locon", quantized_base=True, project_kernels=True, saved_per_fan_in=0.0, up_params=_LORA_UP
    ),
    "loha": Algo("loha", quantized_base=True, up_params=("hada_w1_a", "hada_w2_a")),
    "lokr": Algo(
        "lokr",
        dropouts=(_RANK_MODULE, _INPUT_MODULE),
        quantized_base=True,
        quantized_dora=True,
        up_params=("lokr_w1_a", "lokr_w2_a"),
    ),
    "dora": Algo(
        "lora",
        {"dora_wd": True},
        dropouts=(_RANK_MODULE, _NONE),
        up_params=_LORA_UP,
    ),
    "oft": Algo("diag-oft", dropouts=(frozenset({"rank_dropout"}), _NONE), **_OFT),
    "diag-oft": Algo("diag-oft", dropouts=(frozenset({"rank_dropout"}), _NONE), **_OFT),
    "boft": Algo(
        "boft",
        dropouts=(_NONE, _NONE),
        **{**_OFT, "note": "rank = butterfly block factor"},
    ),
    "glora": Algo("glora", dropouts=(_MODULE, _ALL), quantized_base=True, up_params=("b1.",)),
    "ia3": Algo("ia3", has_rank=False, bypass_same=False, dropouts=(_MODULE, _MODULE)),
    "dylora": Algo(
        "dylora",
        note="rank must be a multiple of block_size (default 4)",
        bypass_same=False,
        bypass_refused="lycoris's DyLoRA bypass forward drops its scale",
        dropouts=(_ALL, _NONE),
        up_params=("up_list",),
        python_state=True,
    ),
    "tlora": Algo(
        "tlora",
        note="SVD init from the base weights; timestep rank mask via adapters.tlora",
        dropouts=(_MODULE, _INPUT_MODULE),
        up_params=("p_layer",),
        step_hook=StepHook(set_tlora_sigma, clear_tlora_mask),
        python_state=True,
        distributed_refusal="masks its ranks by the step runner's sigmas, which DISTRIBUTED redraws per rank",
    ),
}
BYPASS_CHOICES = ("auto", True, False)
ALIASES = {"t-lora": "tlora", "lycoris-lora": "lora", "loraplus": "lora", "dylora-lora": "dylora"}


def resolve_algo(name: str) -> tuple[str, Algo]:
    """(canonical name, Algo) or a ConfigError naming the ALGO knob."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ALGOS:
        raise ConfigError("ALGO", f"unknown algorithm '{name}'; known: {sorted(ALGOS)}")
    return key, ALGOS[key]


def adapter_algo(name: str) -> Algo | None:
    """The Algo of ALGO `name`; None for 'full' (no adapter) and an unknown name (named by its own check)."""
    if str(name) == "full":
        return None
    try:
        return resolve_algo(str(name))[1]
    except ConfigError:
        return None


def reset_step_hook(name: str) -> None:
    """Undo the per-step state ALGO `name` set (before sampling or exporting with the trained adapter)."""
    algo = adapter_algo(name)
    if algo is not None and algo.step_hook is not None:
        algo.step_hook.reset()


def quantized_base_algos() -> list[str]:
    return [n for n, a in ALGOS.items() if a.runs_on_quantized_base({})]


def base_precision_problem(mode: str, name: str, args: dict | None = None) -> str | None:
    """Why BASE_PRECISION `mode` cannot run with ALGO `name` and these ALGO_ARGS, or None."""
    if mode == "same":
        return None
    if name == "full":
        return f"'{mode}' stores a frozen base; ALGO='full' trains the base: use 'same'"
    try:
        _, algo = resolve_algo(str(name))
    except ConfigError:
        return None  # an unknown ALGO is named by its own check
    if algo.runs_on_quantized_base(dict(args or {})):
        return None
    dora = algo.dora(args)
    return (
        f"'{mode}' with ALGO='{name}'{' (DoRA)' if dora else ''}: the adapter reads the frozen weight, "
        f"which LyCORIS does not do on an fp8 or int8 one; use 'same', or ALGO one of "
        f"{quantized_base_algos()} without DoRA"
    )


def base_precision_check(adapter: AdapterConfig, mode: str) -> str | None:
    """base_precision_problem for BASE_PRECISION=`mode` under this adapter (ALGO, ALGO_ARGS)."""
    return base_precision_problem(mode, adapter.algo, adapter.algo_args)


def trained_forward(knobs: dict) -> bool | str | None:
    """What a config's BYPASS decides about the trained function, as resume compares it: None where
    lycoris's bypass and merged forwards compute one function (either resumes the other: only the rounding
    differs) or there is no adapter, else the forward BYPASS picks."""
    name, asked = str(knobs.get("ALGO", "lora")), knobs.get("BYPASS", "auto")
    if name == "full":
        return None
    algo = adapter_algo(name)
    if algo is None:
        return asked  # an unknown ALGO is named by its own check
    args = dict(knobs.get("ALGO_ARGS") or {})
    return None if algo.bypass("auto", args) else algo.bypass(asked, args)
