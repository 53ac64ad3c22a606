"""The plain baseline for scripts/bench/train_step.py: MOSS-Image's block math in plain torch, padded.

No op registry, no memory engines, no LyCORIS: a [B, L, d] padded batch, torch RMSNorm
(F.rms_norm), rotary in plain torch, F.scaled_dot_product_attention, and every linear wrapped in a
tiny LoRA module (frozen base Linear + down/up). Shapes come from a MossConfig; the math is
MossBlock's (kohakumoss/model/blocks.py, reference.py). Imported by train_step.py; not a script.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kohakumoss.model import MossConfig


class PlainLoRA(nn.Module):
    """y = base(x) + up(down(x)) * alpha / rank; the base is frozen, down/up train (up starts at zero)."""

    def __init__(self, fan_in: int, fan_out: int, rank: int, bias: bool, dtype: torch.dtype, lora_dtype):
        super().__init__()
        self.base = nn.Linear(fan_in, fan_out, bias=bias, dtype=dtype)
        self.base.requires_grad_(False)
        self.down = nn.Linear(fan_in, rank, bias=False, dtype=lora_dtype)
        self.up = nn.Linear(rank, fan_out, bias=False, dtype=lora_dtype)
        self.scale = 1.0  # alpha = rank
        nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x)) * self.scale


def rms(x: torch.Tensor, width: int, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """torch's RMSNorm, back in x's dtype (autocast may compute it in float32)."""
    return F.rms_norm(x, (width,), weight, eps).to(x.dtype)


class PlainBlock(nn.Module):
    def __init__(self, cfg: MossConfig, lin, dtype: torch.dtype):
        super().__init__()
        d, self.heads, self.head_dim, self.eps = cfg.dim, cfg.num_heads, cfg.head_dim, cfg.norm_eps
        self.modulation = lin(cfg.mod_dim, 6 * d, True)
        self.q_proj, self.k_proj = lin(d, d, cfg.qkv_bias), lin(d, d, cfg.qkv_bias)
        self.v_proj, self.o_proj = lin(d, d, cfg.qkv_bias), lin(d, d, False)
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim, dtype=dtype), requires_grad=False)
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim, dtype=dtype), requires_grad=False)
        self.gate_up_proj = lin(d, 2 * cfg.mlp_hidden, False)
        self.down_proj = lin(cfg.mlp_hidden, d, False)

    def forward(self, x: torch.Tensor, mod_in: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        B, L, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(mod_in)[:, None, :].chunk(6, dim=-1)
        h = rms(x, d, None, self.eps) * (1 + scale1) + shift1
        shape = (B, L, self.heads, self.head_dim)
        q, k, v = self.q_proj(h).view(shape), self.k_proj(h).view(shape), self.v_proj(h).view(shape)
        q = rotate(rms(q, self.head_dim, self.q_norm, self.eps), cos, sin).to(v.dtype)
        k = rotate(rms(k, self.head_dim, self.k_norm, self.eps), cos, sin).to(v.dtype)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + gate1 * self.o_proj(out.transpose(1, 2).reshape(B, L, d))
        h = rms(x, d, None, self.eps) * (1 + scale2) + shift2
        gate, up = self.gate_up_proj(h).chunk(2, dim=-1)
        return x + gate2 * self.down_proj(F.silu(gate) * up)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D]; cos, sin [B, L, D/2]: rotate pair (i, i + D/2) by angle i."""
    half = x.shape[-1] // 2
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_angles(cfg: MossConfig, n_text: int, rows: int, cols: int, device) -> tuple[torch.Tensor, ...]:
    """cos, sin [L, head_dim/2] for one sample laid out as [text, image] (positions as PackedSeq's)."""
    text = torch.stack([torch.arange(n_text), torch.zeros(n_text), torch.zeros(n_text)], dim=1)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    img = torch.stack([torch.full((rows * cols,), n_text), r.flatten(), c.flatten()], dim=1)
    pos = torch.cat([text, img]).double()
    parts = []
    for axis, size in enumerate(cfg.rope_axes):
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, size, 2, dtype=torch.float64) / size))
        parts.append(pos[:, axis : axis + 1] * inv[None, :])
    angles = torch.cat(parts, dim=1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


class PlainDiT(nn.Module):
    """MOSS-Image on a padded batch of equal-length samples, LoRA on every linear."""

    def __init__(self, cfg: MossConfig, rank: int, dtype: torch.dtype, lora_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg

        def lin(fan_in: int, fan_out: int, bias: bool) -> PlainLoRA:
            return PlainLoRA(fan_in, fan_out, rank, bias, dtype, lora_dtype)

        d = cfg.dim
        self.img_in, self.txt_in = lin(cfg.in_channels, d, True), lin(cfg.text_dim, d, True)
        self.txt_norm = nn.Parameter(torch.ones(cfg.text_dim, dtype=dtype), requires_grad=False)
        self.time_1, self.time_2 = (
            lin(cfg.time_freq_dim, cfg.mod_dim, True),
            lin(cfg.mod_dim, cfg.mod_dim, True),
        )
        self.blocks = nn.ModuleList(PlainBlock(cfg, lin, dtype) for _ in range(cfg.depth))
        self.final_mod, self.final_proj = lin(cfg.mod_dim, 2 * d, True), lin(d, cfg.in_channels, True)
        self.block_fns = list(self.blocks)  # what forward calls per block (compiled copies replace these)

    def init_frozen(self, std: float = 0.02) -> PlainDiT:
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, PlainLoRA):
                    m.base.weight.normal_(0.0, std)
                    if m.base.bias is not None:
                        m.base.bias.normal_(0.0, std)
        return self

    def compile_blocks(self) -> None:
        """Each block through torch.compile; the blocks share one graph (parameters are graph inputs)."""
        import torch._dynamo

        for knob in ("cache_size_limit", "recompile_limit"):  # never fall back to eager after 8 blocks
            if hasattr(torch._dynamo.config, knob):
                setattr(
                    torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 2 * len(self.blocks))
                )
        self.block_fns = [torch.compile(b) for b in self.blocks]

    def forward(self, img, text, sigma, cos, sin) -> torch.Tensor:
        """img [B, N_img, C], text [B, N_text, text_dim], sigma [B]; cos/sin [B, L, D/2]. Returns [B, N_img, C]."""
        cfg = self.cfg
        n_text = text.shape[1]
        txt = rms(text, cfg.text_dim, self.txt_norm, cfg.norm_eps)
        x = torch.cat([self.txt_in(txt), self.img_in(img)], dim=1)
        half = cfg.time_freq_dim // 2
        freqs = torch.exp(
            -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=x.device) / half
        )
        args = (sigma.float() * cfg.time_scale)[:, None] * freqs[None, :]
        t = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        mod_in = F.silu(self.time_2(F.silu(self.time_1(t))))
        for block in self.block_fns:
            x = block(x, mod_in, cos, sin)
        shift, scale = self.final_mod(mod_in)[:, None, :].chunk(2, dim=-1)
        x = x[:, n_text:]
        return self.final_proj(rms(x, cfg.dim, None, cfg.norm_eps) * (1 + scale) + shift)

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]
