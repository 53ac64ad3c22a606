"""Training building blocks: optimizers (Muon + AdamW), LR schedules, EMA, RNG capture, checkpoints."""

from .checkpoint import (
    Checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
    step_dirname,
)
from .ema import EMA
from .optim import (
    CombinedOptimizer,
    build_adamw,
    build_full_ft_optimizer,
    is_muon_param,
    split_full_ft_params,
)
from .rng import capture_rng, restore_rng
from .schedule import SCHEDULES, LRSchedule
from .state import load_trainable_state, trainable_state

__all__ = [
    "EMA",
    "SCHEDULES",
    "Checkpoint",
    "CombinedOptimizer",
    "LRSchedule",
    "build_adamw",
    "build_full_ft_optimizer",
    "capture_rng",
    "is_muon_param",
    "list_checkpoints",
    "load_checkpoint",
    "load_trainable_state",
    "prune_checkpoints",
    "resolve_checkpoint",
    "restore_rng",
    "save_checkpoint",
    "split_full_ft_params",
    "step_dirname",
    "trainable_state",
]
