"""MossBackbone(img, text, sigma, seq) -> v: the single-stream DiT over one packed token axis.

img [T_img, in_channels] patchified latent tokens, text [T_text, text_dim] encoder hidden states,
sigma [B] noise levels, seq the PackedSeq layout. Returns the predicted velocity per image token.
No data loading, loss or sampler in here; attention stays within each sample; no padding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kohakumoss_kernels import OpSet

from .blocks import MossBlock
from .config import MossConfig
from .embed import TimestepEmbed
from .rope import rope_cos_sin
from .seq import PackedSeq


class FinalLayer(nn.Module):
    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.modulation = nn.Linear(cfg.mod_dim, 2 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.in_channels)

    def forward(self, x: torch.Tensor, mod_in: torch.Tensor, token_sample: torch.Tensor, ops) -> torch.Tensor:
        shift, scale = self.modulation(mod_in).chunk(2, dim=-1)
        return self.proj(ops.norm_modulate(x, shift, scale, token_sample, self.eps))


class MossBackbone(nn.Module):
    def __init__(self, config: MossConfig, ops: OpSet | None = None):
        super().__init__()
        self.config = config
        self.ops = ops if ops is not None else OpSet("auto")
        self.img_in = nn.Linear(config.in_channels, config.dim)
        self.txt_norm = nn.RMSNorm(config.text_dim, eps=config.norm_eps) if config.text_norm else None
        self.txt_in = nn.Linear(config.text_dim, config.dim)
        self.time_embed = TimestepEmbed(config.time_freq_dim, config.mod_dim, config.time_scale)
        self.blocks = nn.ModuleList(MossBlock(config) for _ in range(config.depth))
        self.final = FinalLayer(config)
        # how each block is called; memory engines (checkpointing, streaming) replace this wrapper
        self.block_runner: Callable[..., torch.Tensor] | None = None

    def embed(self, img: torch.Tensor, text: torch.Tensor, seq: PackedSeq) -> torch.Tensor:
        """Project both streams and interleave them onto the joint axis ([text, image] per sample)."""
        ops = self.ops
        txt = (
            ops.rms_norm(text, self.txt_norm.weight, self.config.norm_eps)
            if self.txt_norm is not None
            else text
        )
        return torch.cat([self.txt_in(txt), self.img_in(img)], dim=0)[seq.joint_gather]

    def forward(
        self, img: torch.Tensor, text: torch.Tensor, sigma: torch.Tensor, seq: PackedSeq
    ) -> torch.Tensor:
        cfg = self.config
        x = self.embed(img, text, seq)
        mod_in = nn.functional.silu(self.time_embed(sigma))
        rope = rope_cos_sin(seq.positions, cfg.rope_axes, cfg.rope_theta)
        run = self.block_runner
        for block in self.blocks:
            x = run(block, x, mod_in, seq, rope) if run is not None else block(x, mod_in, seq, rope, self.ops)
        return self.final(x[seq.img_index], mod_in, seq.img_token_sample, self.ops)

    def init_weights(
        self, std: float = 0.02, generator: torch.Generator | None = None, via: torch.device | None = None
    ) -> MossBackbone:
        """Random weights (normal linears, unit norms): for tests and the random-weight benchmarks.

        via: draw the values on this device and copy them in (a GPU fills a host-built 5B model in
        seconds instead of minutes); `generator` must then live on `via`.
        """
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            with torch.no_grad():
                if p.ndim == 1 and not name.endswith("bias"):
                    p.fill_(1.0)
                elif via is None:
                    p.normal_(0.0, std, generator=generator)
                else:
                    drawn = torch.empty(p.shape, dtype=p.dtype, device=via).normal_(
                        0.0, std, generator=generator
                    )
                    p.copy_(drawn)
        return self
