"""Random packed batches for model tests."""

from __future__ import annotations

import torch

from kohakumoss.model import MossBackbone, MossConfig, PackedSeq


def random_batch(cfg: MossConfig, text_lens, img_sizes, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    texts = [torch.randn(n, cfg.text_dim, generator=g, dtype=dtype) for n in text_lens]
    imgs = [torch.randn(h * w, cfg.in_channels, generator=g, dtype=dtype) for h, w in img_sizes]
    sigma = torch.rand(len(text_lens), generator=g, dtype=dtype)
    seq = PackedSeq.build(text_lens, img_sizes)
    return imgs, texts, sigma, seq


def random_model(cfg: MossConfig, seed: int = 0) -> MossBackbone:
    torch.manual_seed(seed)
    return MossBackbone(cfg).init_weights(std=0.05, generator=torch.Generator().manual_seed(seed)).eval()
