"""LoRA+ parameter groups: the output-side ("up", B) factors get `up_lr_ratio` times the learning rate.

LyCORIS's own kohya wrapper puts parameters named `lora_up` in its LoRA+ group; the other algorithms'
output-side factors are named by their `Algo.up_params` (LoHa w*_a, LoKr w*_a, GLoRA b1, T-LoRA p_layer,
DyLoRA up_list). OFT, BOFT and IA3 have no up/down split: all their parameters stay in the base group.
"""

from __future__ import annotations

from lycoris import LycorisNetwork

from .algos import ALGOS

UP_MARKERS = tuple(sorted({m for algo in ALGOS.values() for m in algo.up_params}))


def is_up_param(name: str) -> bool:
    return any(m in name for m in UP_MARKERS)


def adapter_param_groups(
    network: LycorisNetwork, lr: float, up_lr_ratio: float | None = None, weight_decay: float = 0.0
) -> list[dict]:
    """Optimizer param groups ('adapter', and 'adapter_up' when up_lr_ratio is set) with their lr."""
    base, up = [], []
    for name, p in network.named_parameters():
        if not p.requires_grad:
            continue
        (up if up_lr_ratio is not None and is_up_param(name) else base).append(p)
    groups = [{"name": "adapter", "params": base, "lr": lr, "weight_decay": weight_decay}]
    if up:
        groups.append(
            {"name": "adapter_up", "params": up, "lr": lr * up_lr_ratio, "weight_decay": weight_decay}
        )
    return [g for g in groups if g["params"]]
