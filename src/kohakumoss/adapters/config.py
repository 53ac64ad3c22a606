"""AdapterConfig: the adapter knobs of a training run (ALGO, RANK, ALPHA, targets, dropouts, BYPASS).

A section of `TrainConfig` (config/train.py composes it); `AdapterConfig.spec()` is the adapter the trainer
attaches and a checkpoint's re-export rebuilds.
"""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss_common.typed_config import knob

from .algos import ALGOS, BYPASS_CHOICES
from .spec import AdapterSpec
from .targets import TARGET_PRESETS

ALGO_CHOICES = (*sorted(ALGOS), "full")


def _algo_args(value: dict) -> str | None:
    from .algo_args import unknown_args_problem  # ALGO's own: train/components.py

    return unknown_args_problem(value)


@dataclass(frozen=True)
class AdapterConfig:
    """The adapter (LyCORIS) or a full fine-tune."""

    algo: str = knob(
        AdapterSpec.algo,
        "adapter algorithm (LyCORIS) or 'full' for a full fine-tune",
        resume="fixed",
        choices=ALGO_CHOICES,
    )
    rank: int = knob(AdapterSpec.rank, "adapter rank (block size for OFT / BOFT)", resume="fixed", min=1)
    alpha: float = knob(AdapterSpec.alpha, "adapter alpha (scale = ALPHA / RANK)", resume="fixed", min=0.0)
    algo_args: dict = knob(
        {},
        "extra LyCORIS arguments (factor, block_size, constraint, ...): only options lycoris reads and ALGO uses",
        resume="fixed",
        check=_algo_args,
    )
    target_preset: str = knob(
        AdapterSpec.preset,
        "which modules the adapter wraps",
        resume="fixed",
        choices=(*TARGET_PRESETS, "custom"),
    )
    target_patterns: list = knob(
        [], "module name regexes or globs for TARGET_PRESET='custom'", resume="fixed"
    )
    dropout: float = knob(AdapterSpec.dropout, "adapter dropout", resume="safe", min=0.0, max=1.0)
    rank_dropout: float = knob(
        AdapterSpec.rank_dropout, "adapter rank dropout", resume="safe", min=0.0, max=1.0
    )
    module_dropout: float = knob(
        AdapterSpec.module_dropout, "adapter module dropout", resume="safe", min=0.0, max=1.0
    )
    lora_plus_ratio: float = knob(
        0.0, "LoRA+: LR multiplier of the up matrices (0: off)", resume="safe", min=0.0
    )
    bypass: bool | str = knob(
        AdapterSpec.bypass,
        "True: lycoris's bypass forward (base output + adapter output; LoRA / LoCon run the fused kernels), False: the merged-weight forward; auto: bypass where both compute one function (every algorithm but OFT, BOFT, IA3, DyLoRA and DoRA)",
        resume="fixed",
        choices=BYPASS_CHOICES,
    )

    def spec(self, multiplier: float = 1.0, dropouts: bool = True) -> AdapterSpec:
        """The adapter these knobs build: what the trainer attaches and what a re-export rebuilds from a
        checkpoint's knobs (`dropouts=False`: the export's network, whose forward is never trained)."""
        drop = (self.dropout, self.rank_dropout, self.module_dropout) if dropouts else (0.0, 0.0, 0.0)
        return AdapterSpec(
            algo=self.algo,
            rank=int(self.rank),
            alpha=float(self.alpha),
            preset=self.target_preset,
            patterns=tuple(self.target_patterns),
            dropout=drop[0],
            rank_dropout=drop[1],
            module_dropout=drop[2],
            bypass=self.bypass,
            multiplier=multiplier,
            algo_args=dict(self.algo_args),
        )
