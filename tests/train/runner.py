"""A minimal deterministic training loop on the tiny model, for the optimizer, EMA and resume tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kohakumoss.adapters import adapter_param_groups, build_adapter
from kohakumoss.diffusion import TimestepConfig, draw_sigmas, flow_matching_loss, make_flow_target
from kohakumoss.model import MossBackbone, PackedSeq
from kohakumoss.optim.build import build_adamw, build_full_ft_optimizer
from kohakumoss.optim.combined import CombinedOptimizer
from kohakumoss.train import EMA, LRSchedule

from ..adapters.helpers import CFG, tiny_model

TEXT_LENS, IMG_SIZES = (5, 7), ((4, 4), (3, 5))
TIMESTEPS = TimestepConfig(shift="none")


@dataclass
class Run:
    model: MossBackbone
    trainable: nn.Module  # the adapter network or the model itself
    optimizer: CombinedOptimizer
    ema: EMA
    schedule: LRSchedule
    noise_gen: torch.Generator


def make_run(kind: str, steps: int = 20) -> Run:
    model = tiny_model()
    if kind == "lora":
        # bypass + dropout + rank dropout: the forward draws from the global torch RNG every step
        net = build_adapter(
            model, "lora", rank=4, alpha=4, preset="attn-mlp", bypass=True, dropout=0.1, rank_dropout=0.1
        )
        opt = build_adamw(adapter_param_groups(net, 2e-3, up_lr_ratio=4.0, weight_decay=0.01), lr=2e-3)
        trainable: nn.Module = net
    else:
        model.requires_grad_(True)
        opt = build_full_ft_optimizer(model, lr=2e-3, weight_decay=0.01)
        trainable = model
    model.train()
    ema = EMA(trainable, decay=0.9, warmup=4, every=2)
    schedule = LRSchedule("cosine", warmup_steps=3, total_steps=steps, min_ratio=0.1)
    return Run(model, trainable, opt, ema, schedule, torch.Generator().manual_seed(1234))


def data_at(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic data sequence: clean tokens and text for `step` (a pure function of step)."""
    g = torch.Generator().manual_seed(10_000 + step % 4)
    x0 = torch.randn(sum(h * w for h, w in IMG_SIZES), CFG.in_channels, generator=g)
    return x0, torch.randn(sum(TEXT_LENS), CFG.text_dim, generator=g)


def train_step(run: Run, step: int) -> torch.Tensor:
    seq = PackedSeq.build(list(TEXT_LENS), list(IMG_SIZES))
    x0, text = data_at(step)
    sigma = draw_sigmas(TIMESTEPS, torch.tensor([h * w for h, w in IMG_SIZES]), run.noise_gen)
    noise = torch.randn(x0.shape, generator=run.noise_gen)
    ft = make_flow_target(x0, sigma, seq.img_token_sample, noise)
    loss = flow_matching_loss(run.model(ft.x_t, text, sigma, seq), ft.target, sigma, seq.img_token_sample)
    run.optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.optimizer.params(), 1.0)
    run.schedule.apply(run.optimizer, step)
    run.optimizer.step()
    run.ema.update(step)
    return loss.detach()
