"""The plain baseline for scripts/bench/train_step.py: the released MOSS-Image in plain torch, padded.

No op registry, no memory engines, no LyCORIS: a [B, L, d] batch of equal-length samples (image tokens,
then text), torch RMSNorm with weight (F.rms_norm), the 4-axis rotate-half rotary of
kohakumoss.model.rope, F.scaled_dot_product_attention, SiTU-GLU as its formula, one shared block
modulation, the two unmodulated text refiner blocks over the text tokens, and every linear wrapped in a
tiny LoRA module (frozen base Linear + down/up). Parameter shapes are the product's (MossBackbone's), so
its FLOPs are the same; the math is MossBlock's (kohakumoss/model/blocks.py, reference.py). Imported by
train_step.py; not a script.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kohakumoss.model import MossConfig
from kohakumoss.model.embed import timestep_features
from kohakumoss.model.rope import rope_cos_sin
from kohakumoss.model.seq import sample_positions


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


def norm_weight(width: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.ones(width, dtype=dtype), requires_grad=False)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's RMSNorm with weight, back in x's dtype (autocast may compute it in float32)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps).to(x.dtype)


def situ_glu(h: torch.Tensor) -> torch.Tensor:
    """[hidden | gate] -> (4 tanh(gate / 4) sigmoid(gate)) * (25 tanh(hidden / 25))."""
    hidden, gate = h.chunk(2, dim=-1)
    return (4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate)) * (25.0 * torch.tanh(hidden / 25.0))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D]; cos, sin [B, L, D/2]: rotate-half, pair (i, i + D/2) by frequency i."""
    c = torch.cat([cos, cos], -1)[:, :, None, :].to(x.dtype)
    s = torch.cat([sin, sin], -1)[:, :, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


def attention(q, k, v, q_norm, k_norm, cos, sin, heads: int, eps: float) -> torch.Tensor:
    """[B, L, d] q, k, v -> per-head RMSNorm, rotary, SDPA over the whole sample -> [B, L, d]."""
    B, L, d = q.shape
    shape = (B, L, heads, d // heads)
    q = rotate(rms(q.view(shape), q_norm, eps), cos, sin)
    k = rotate(rms(k.view(shape), k_norm, eps), cos, sin)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.view(shape).transpose(1, 2))
    return out.transpose(1, 2).reshape(B, L, d)


class PlainNorms(nn.Module):
    """The norm weights both block kinds hold: norm1, norm2 and the per-head q_norm, k_norm."""

    def __init__(self, cfg: MossConfig, dtype: torch.dtype):
        super().__init__()
        self.heads, self.eps = cfg.num_heads, cfg.norm_eps
        self.norm1, self.norm2 = norm_weight(cfg.dim, dtype), norm_weight(cfg.dim, dtype)
        self.q_norm, self.k_norm = norm_weight(cfg.head_dim, dtype), norm_weight(cfg.head_dim, dtype)


class PlainBlock(PlainNorms):
    """`layers.N`: modulated by the shared modulation, bias-free q, k, v, o, ffn_up_gate, ffn_down."""

    def __init__(self, cfg: MossConfig, lin, dtype: torch.dtype):
        super().__init__(cfg, dtype)
        d, h = cfg.dim, cfg.mlp_hidden
        self.q, self.k, self.v, self.o = (lin(d, d, False) for _ in range(4))
        self.ffn_up_gate, self.ffn_down = lin(d, 2 * h, False), lin(h, d, False)

    def forward(self, x: torch.Tensor, mod: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, L, d]; mod [6, B, 1, d]: shift_a, scale_a, gate_a, shift_f, scale_f, gate_f."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mod
        y = rms(x, self.norm1, self.eps) * (1 + scale_a) + shift_a
        out = attention(
            self.q(y), self.k(y), self.v(y), self.q_norm, self.k_norm, cos, sin, self.heads, self.eps
        )
        x = x + gate_a * self.o(out)
        y = rms(x, self.norm2, self.eps) * (1 + scale_f) + shift_f
        return x + gate_f * self.ffn_down(situ_glu(self.ffn_up_gate(y)))


class PlainRefinerBlock(PlainNorms):
    """`text_embedder.blocks.N`: no modulation, fused qkv, biases, separate ffn_gate / ffn_up / ffn_down."""

    def __init__(self, cfg: MossConfig, lin, dtype: torch.dtype):
        super().__init__(cfg, dtype)
        d, h = cfg.dim, cfg.mlp_hidden
        self.qkv, self.proj = lin(d, 3 * d, True), lin(d, d, True)
        self.ffn_gate, self.ffn_up, self.ffn_down = lin(d, h, True), lin(d, h, True), lin(h, d, True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(rms(x, self.norm1, self.eps)).chunk(3, dim=-1)
        x = x + self.proj(attention(q, k, v, self.q_norm, self.k_norm, cos, sin, self.heads, self.eps))
        y = rms(x, self.norm2, self.eps)
        return x + self.ffn_down(situ_glu(torch.cat([self.ffn_up(y), self.ffn_gate(y)], dim=-1)))


def rope_angles(cfg: MossConfig, n_text: int, rows: int, cols: int, device) -> tuple[torch.Tensor, ...]:
    """cos, sin [L, head_dim/2] for one sample laid out as [image, text] (positions as PackedSeq's)."""
    img, text = sample_positions(n_text, rows, cols)
    cos, sin = rope_cos_sin(torch.cat([img, text]), cfg.head_dim, cfg.rope_theta)
    return cos.to(device), sin.to(device)


class PlainDiT(nn.Module):
    """MOSS-Image on a batch of equal-length samples, LoRA on every linear (as TARGET_PRESET 'full')."""

    def __init__(self, cfg: MossConfig, rank: int, dtype: torch.dtype, lora_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg

        def lin(fan_in: int, fan_out: int, bias: bool) -> PlainLoRA:
            return PlainLoRA(fan_in, fan_out, rank, bias, dtype, lora_dtype)

        d = cfg.dim
        self.video_embedder = lin(cfg.in_channels, d, True)
        self.text_proj = lin(cfg.text_dim, d, True)
        self.refiner = nn.ModuleList(PlainRefinerBlock(cfg, lin, dtype) for _ in range(cfg.refiner_depth))
        self.time_1, self.time_2 = lin(cfg.time_freq_dim, d, True), lin(d, d, True)
        self.shared_block_modulation = lin(d, 6 * d, True)
        self.layers = nn.ModuleList(PlainBlock(cfg, lin, dtype) for _ in range(cfg.depth))
        self.final_norm_video = norm_weight(d, dtype)
        self.video_head_modulation = lin(d, 2 * d, True)
        self.final_linear_video = lin(d, cfg.in_channels, False)
        self.block_fns = list(self.layers)  # what forward calls per block (compiled copies replace these)

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
                    torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 2 * len(self.layers))
                )
        self.block_fns = [torch.compile(b) for b in self.layers]

    def forward(self, img, text, sigma, cos, sin) -> torch.Tensor:
        """img [B, N_img, C], text [B, N_text, text_dim], sigma [B]; cos/sin [B, L, D/2] of [image, text].
        Returns [B, N_img, C]."""
        cfg = self.cfg
        B, n_img = img.shape[:2]
        dtype = self.time_1.base.weight.dtype
        feats = timestep_features(sigma, cfg.time_freq_dim, cfg.time_scale).to(dtype)
        time = self.time_2(F.silu(self.time_1(feats)))  # no SiLU before the modulations
        mod = self.shared_block_modulation(time).view(B, 6, 1, -1).transpose(0, 1)
        shift, scale = self.video_head_modulation(time).view(B, 2, 1, -1).transpose(0, 1)
        txt = self.text_proj(text)
        for block in self.refiner:  # over the text tokens alone, at their joint positions (0, j, 0, 0)
            txt = block(txt, cos[:, n_img:], sin[:, n_img:])
        x = torch.cat([self.video_embedder(img), txt.to(dtype)], dim=1)
        for block in self.block_fns:
            x = block(x, mod, cos, sin)
        y = rms(x[:, :n_img], self.final_norm_video, cfg.norm_eps) * (1 + scale) + shift
        return self.final_linear_video(y)

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]
