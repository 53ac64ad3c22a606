"""The transformer block: AdaLN-modulated attention and MLP on the packed token axis.

    shift1, scale1, gate1, shift2, scale2, gate2 = modulation(silu(t_emb))     (per sample)
    x = x + gate1 * attn(rms_norm(x) * (1 + scale1) + shift1)
    x = x + gate2 * mlp(rms_norm(x) * (1 + scale2) + shift2)

Every elementwise op goes through `ops` (a kohakumoss_kernels.OpSet); the linears stay nn.Linear so
LyCORIS can wrap them by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import MossConfig
from .seq import PackedSeq


class Attention(nn.Module):
    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.num_heads, self.head_dim, self.eps = cfg.num_heads, cfg.head_dim, cfg.norm_eps
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project_qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of h. adapters/fast.py may set a grouped version on the instance (one op for the
        three LoRA linears that read h); it computes the same."""
        return self.q_proj(h), self.k_proj(h), self.v_proj(h)

    def forward(
        self, h: torch.Tensor, seq: PackedSeq, rope: tuple[torch.Tensor, torch.Tensor], ops
    ) -> torch.Tensor:
        shape = (h.shape[0], self.num_heads, self.head_dim)
        q, k, v = (t.view(shape) for t in self.project_qkv(h))
        cos, sin = rope
        if self.q_norm is not None:  # QK-norm and rotary in one pass
            q = ops.qk_norm_rope(q, self.q_norm.weight, cos, sin, self.eps)
            k = ops.qk_norm_rope(k, self.k_norm.weight, cos, sin, self.eps)
        else:
            q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        out = ops.varlen_attention(q, k, v, seq.cu_seqlens, seq.max_seqlen)
        return self.o_proj(out.reshape(h.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.act = cfg.mlp_act
        if self.act == "swiglu":
            self.gate_up_proj = nn.Linear(cfg.dim, 2 * cfg.mlp_hidden, bias=False)
        else:
            self.up_proj = nn.Linear(cfg.dim, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=False)

    def forward(self, h: torch.Tensor, ops) -> torch.Tensor:
        if self.act == "swiglu":
            return self.down_proj(ops.swiglu(self.gate_up_proj(h)))
        return self.down_proj(F.gelu(self.up_proj(h), approximate="tanh"))


class MossBlock(nn.Module):
    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.modulation = nn.Linear(cfg.mod_dim, 6 * cfg.dim)
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def attention_half(
        self, x: torch.Tensor, mods: tuple[torch.Tensor, ...], seq: PackedSeq, rope, ops
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x -> (x + gate1 * attn(...), the MLP's AdaLN input): the residual add and the next modulate fused."""
        shift1, scale1, gate1, shift2, scale2, _ = mods
        ts = seq.token_sample
        h, x = ops.norm_modulate(x, shift1, scale1, ts, self.eps, fork=True)  # x's two gradients in one pass
        return ops.residual_norm_modulate(
            x, self.attn(h, seq, rope, ops), gate1, shift2, scale2, ts, self.eps
        )

    def mlp_half(
        self, x: torch.Tensor, h: torch.Tensor, mods: tuple[torch.Tensor, ...], seq: PackedSeq, ops
    ) -> torch.Tensor:
        return ops.gated_residual(x, self.mlp(h, ops), mods[5], seq.token_sample)

    def modulations(self, mod_in: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """shift1, scale1, gate1, shift2, scale2, gate2, each [B, d] and contiguous: one copy of [6, B, d]
        instead of a copy per chunk inside each op (chunks of [B, 6d] are strided when B > 1)."""
        mod = self.modulation(mod_in)
        return mod.view(mod.shape[0], 6, -1).transpose(0, 1).contiguous().unbind(0)

    def forward(
        self,
        x: torch.Tensor,
        mod_in: torch.Tensor,
        seq: PackedSeq,
        rope: tuple[torch.Tensor, torch.Tensor],
        ops,
    ) -> torch.Tensor:
        mods = self.modulations(mod_in)
        x, h = self.attention_half(x, mods, seq, rope, ops)
        return self.mlp_half(x, h, mods, seq, ops)
