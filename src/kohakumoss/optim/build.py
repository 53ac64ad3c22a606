"""Optimizers: Muon for the blocks' hidden 2-D matrices and AdamW for the rest, as one object.

Full fine-tune follows the MOSS recipe: `torch.optim.Muon` (2-D parameters only) takes the attention
and SiTU-GLU weight matrices of every block and text refiner block; AdamW takes embedders, norms, the
modulations, biases and the final layer. Muon's `adjust_lr_fn="match_rms_adamw"` scales its update to AdamW's RMS, so one LR fits both.
Adapters train with AdamW on LoRA+ groups. OPTIMIZER swaps AdamW (the adapter's, or a full fine-tune's
non-Muon member) for AdamW 8-bit, Adafactor, Prodigy, schedule-free AdamW or any `package.Class`, with
OPTIMIZER_ARGS as keyword arguments. Every optimizer is wrapped in `CombinedOptimizer` so the trainer, the
LR schedule and checkpoints see one interface.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.optim import AdamW, Muon, Optimizer

from kohakumoss_common.errors import ConfigError

from .combined import CombinedOptimizer
from .names import DEFAULT_OPTIMIZER, optimizer_location, optimizer_problem

USE_MUON = True  # a full fine-tune's hidden matrices step with Muon (the USE_MUON knob's default)


def optimizer_class(name: str) -> type[Optimizer]:
    """The torch Optimizer class OPTIMIZER `name` stands for (imported on demand)."""
    problem = optimizer_problem(name)
    if problem:
        raise ConfigError("OPTIMIZER", problem)
    module, cls_name, _ = optimizer_location(name)
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError("OPTIMIZER", f"'{name}': cannot import {cls_name} from {module} ({e})") from e
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise ConfigError("OPTIMIZER", f"'{name}' is not a torch.optim.Optimizer subclass")
    return cls


def make_optimizer(name: str, groups: list[dict], lr: float, args: dict | None = None) -> Optimizer:
    """OPTIMIZER `name` over `groups` at `lr`, with OPTIMIZER_ARGS as keyword arguments."""
    cls = optimizer_class(name)
    try:
        return cls(groups, lr=lr, **dict(args or {}))
    except (TypeError, ValueError) as e:
        raise ConfigError("OPTIMIZER_ARGS", f"{cls.__name__}({args or {}}) refused: {e}") from e


def has_modes(optimizer) -> bool:
    """A member keeps separate train and eval weights (schedule-free): see `eval_weights`."""
    return any(callable(getattr(o, "eval", None)) for o in getattr(optimizer, "optimizers", {}).values())


def set_train_mode(optimizer, train: bool) -> None:
    """Put members with train/eval weights (schedule-free) in train or eval mode; others are unaffected."""
    for opt in getattr(optimizer, "optimizers", {}).values():
        switch = getattr(opt, "train" if train else "eval", None)
        if callable(switch):
            switch()


@contextlib.contextmanager
def eval_weights(optimizer) -> Iterator[None]:
    """Schedule-free: the parameters hold the averaged (eval) weights inside, the training point after.

    Wrap sampling, validation and checkpoint / export writes in it: what is saved and sampled is the
    averaged x, and the optimizer state saved beside it says 'eval mode', so a resume that calls
    `set_train_mode(opt, True)` after loading both is where the run left off.
    """
    if not has_modes(optimizer):
        yield
        return
    set_train_mode(optimizer, False)
    try:
        yield
    finally:
        set_train_mode(optimizer, True)


_MUON_NAME = re.compile(
    r"^(layers\.\d+\.proj\.(q|k|v|o|ffn_up_gate|ffn_down)"
    r"|text_embedder\.blocks\.\d+\.(qkv|proj|ffn_gate|ffn_up|ffn_down))\.weight$"
)


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    """A hidden weight matrix of a block or refiner block; never embedders, modulations, norms or biases."""
    return p.ndim == 2 and bool(_MUON_NAME.match(name))


def split_full_ft_params(
    model: nn.Module,
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(muon, adamw_decay, adamw_no_decay) named trainable parameters; 1-D ones get no weight decay."""
    muon, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if is_muon_param(name, p):
            muon.append((name, p))
        elif p.ndim >= 2:
            decay.append((name, p))
        else:
            no_decay.append((name, p))
    return muon, decay, no_decay


def build_full_ft_optimizer(
    model: nn.Module,
    lr: float,
    muon_lr: float | None = None,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    muon_momentum: float = 0.95,
    muon_weight_decay: float | None = None,
    adjust_lr_fn: str = "match_rms_adamw",
    use_muon: bool = USE_MUON,
    optimizer: str = DEFAULT_OPTIMIZER,
    optimizer_args: dict | None = None,
) -> CombinedOptimizer:
    """Muon (hidden matrices) + AdamW (everything else) over the model's trainable parameters; `optimizer`
    (an OPTIMIZER name) replaces that AdamW member."""
    muon, decay, no_decay = split_full_ft_params(model)
    if not use_muon:
        decay, muon = decay + muon, []
    opts: dict[str, Optimizer] = {}
    if muon:
        wd = weight_decay if muon_weight_decay is None else muon_weight_decay
        group = {"name": "muon", "params": [p for _, p in muon]}
        opts["muon"] = Muon(
            [group],
            lr=muon_lr if muon_lr is not None else lr,
            weight_decay=wd,
            momentum=muon_momentum,
            adjust_lr_fn=adjust_lr_fn,
        )
    groups = [
        {"name": "adamw", "params": [p for _, p in decay], "weight_decay": weight_decay},
        {"name": "adamw_no_decay", "params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if groups and optimizer == "adamw" and not optimizer_args:
        opts["adamw"] = AdamW(groups, lr=lr, betas=betas, eps=eps)
    elif groups:
        opts[optimizer] = make_optimizer(optimizer, groups, lr, optimizer_args)
    combined = CombinedOptimizer(opts)
    set_train_mode(combined, True)
    return combined


def build_adamw(
    groups: Iterable[dict], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
) -> CombinedOptimizer:
    """AdamW over prepared groups (e.g. `adapters.adapter_param_groups` for LoRA+)."""
    return CombinedOptimizer({"adamw": AdamW(list(groups), lr=lr, betas=betas, eps=eps)})


def build_adapter_optimizer(
    groups: Iterable[dict], lr: float, optimizer: str = DEFAULT_OPTIMIZER, optimizer_args: dict | None = None
) -> CombinedOptimizer:
    """OPTIMIZER over prepared groups; plain AdamW is `build_adamw`'s (same member name in checkpoints).
    Schedule-free members start in train mode."""
    groups = list(groups)
    if optimizer == "adamw" and not optimizer_args:
        return build_adamw(groups, lr)
    if optimizer == "prodigy" and len({g.get("lr", lr) for g in groups}) > 1:
        raise ConfigError("LORA_PLUS_RATIO", "Prodigy estimates one step size for all groups: set it to 0")
    combined = CombinedOptimizer({optimizer: make_optimizer(optimizer, groups, lr, optimizer_args)})
    set_train_mode(combined, True)
    return combined
