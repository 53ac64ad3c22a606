"""A fixed synthetic flow-matching batch on the tiny model, shared by the adapter/train/export tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kohakumoss.adapters.algos import ALGOS
from kohakumoss.diffusion import flow_matching_loss, make_flow_target
from kohakumoss.model import MossBackbone, PackedSeq, get_preset

from ..model.helpers import random_model

CFG = get_preset("tiny")
# lycoris arguments that fit the tiny model's widths (LoKr's factor, DyLoRA's block size)
TINY_ARGS = {"lokr": {"factor": 4}, "dylora": {"block_size": 4}}


def algo_names() -> list[str]:
    """Every algorithm of the registry once: a name whose record equals an earlier one's ('diag-oft' is
    'oft') is left out."""
    out: list[str] = []
    for name, algo in ALGOS.items():
        if all(ALGOS[seen] != algo for seen in out):
            out.append(name)
    return out


@dataclass
class FlowBatch:
    img: torch.Tensor  # noisy tokens x_t
    text: torch.Tensor
    sigma: torch.Tensor
    seq: PackedSeq
    target: torch.Tensor


def flow_batch(seed: int = 0, text_lens=(5, 7), img_sizes=((4, 4), (3, 5))) -> FlowBatch:
    """Clean tokens, text, sigma and noise drawn from `seed`, turned into (x_t, target) by the objective."""
    g = torch.Generator().manual_seed(seed)
    seq = PackedSeq.build(list(text_lens), list(img_sizes))
    n_img = sum(h * w for h, w in img_sizes)
    x0 = torch.randn(n_img, CFG.in_channels, generator=g)
    text = torch.randn(sum(text_lens), CFG.text_dim, generator=g)
    sigma = torch.rand(len(text_lens), generator=g) * 0.8 + 0.1
    noise = torch.randn(n_img, CFG.in_channels, generator=g)
    ft = make_flow_target(x0, sigma, seq.img_token_sample, noise)
    return FlowBatch(ft.x_t, text, sigma, seq, ft.target)


def tiny_model(seed: int = 0) -> MossBackbone:
    return random_model(CFG, seed)


def forward(model: MossBackbone, b: FlowBatch) -> torch.Tensor:
    return model(b.img, b.text, b.sigma, b.seq)


def flow_loss(model: MossBackbone, b: FlowBatch) -> torch.Tensor:
    return flow_matching_loss(forward(model, b), b.target, b.sigma, b.seq.img_token_sample)
