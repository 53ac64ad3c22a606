"""The transformer blocks of MOSS-Image, on the packed token axis. Parameter names are the released ones.

MossBlock (`layers.N`), modulated by the one shared block modulation (shift_a, scale_a, gate_a, shift_f,
scale_f, gate_f, each a row per sample, plus the t = 0 row reference tokens read: `seq.token_sample`):

    y = norm1(x) * (1 + scale_a) + shift_a            norm1, norm2: RMSNorm with weight, eps 1e-6
    x = x + gate_a * o(attn(q_norm(q(y)), k_norm(k(y)), v(y)))      q_norm, k_norm per head, then RoPE
    y = norm2(x) * (1 + scale_f) + shift_f
    x = x + gate_f * ffn_down(situ_glu(ffn_up_gate(y)))

TextRefinerBlock (`text_embedder.blocks.N`): the same without modulation, over each sample's text alone,
with a fused qkv, biases, and separate ffn_gate / ffn_up / ffn_down.

A norm's weight folds into the modulation's scale, rms(x) * w * (1 + s) = rms(x) * (1 + (w (1 + s) - 1)),
so the fused norm_modulate ops serve the weighted norms unchanged. Every elementwise op goes through `ops`
(a kohakumoss_kernels.OpSet); the linears stay nn.Linear so LyCORIS can wrap them by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .config import MossConfig
from .seq import PackedSeq

BLOCK_LINEARS = ("q", "k", "v", "o", "ffn_up_gate", "ffn_down")


def fold_norm_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The scale s' with rms(x) * (1 + s') == rms(x) * weight * (1 + scale): [B, d] float32."""
    return weight.float() * (1.0 + scale.float()) - 1.0


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_norm: nn.RMSNorm,
    k_norm: nn.RMSNorm,
    rope: tuple[torch.Tensor, torch.Tensor],
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    num_heads: int,
    eps: float,
    ops,
    segments: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    kv_hook: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """[T, d] q, k, v -> per-head QK-norm and RoPE -> attention within each cu_seqlens run -> [T, d].
    segments: (kv_index, cu_seqlens_q, cu_seqlens_kv) with reference images (PackedSeq.attention_segments):
    the keys and values gathered to the key segments, reference queries seeing references alone.
    kv_hook: sees (and may extend) the keys and values after RoPE: the sampler's reference K/V cache."""
    shape = (q.shape[0], num_heads, q.shape[-1] // num_heads)
    q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
    cos, sin = rope
    q = ops.qk_norm_rope(q, q_norm.weight, cos, sin, eps)
    k = ops.qk_norm_rope(k, k_norm.weight, cos, sin, eps)
    if kv_hook is not None:
        k, v = kv_hook(k, v)
    if segments is None:
        return ops.varlen_attention(q, k, v, cu_seqlens, max_seqlen).reshape(q.shape[0], -1)
    kv_index, cu_q, cu_kv = segments
    k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
    out = ops.segment_attention(q, k, v, cu_q, cu_kv, max_seqlen, max_seqlen)
    return out.reshape(q.shape[0], -1)


class _NormedBlock(nn.Module):
    """The weights both block kinds share: norm1, norm2 (width d) and the per-head q_norm, k_norm."""

    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.num_heads, self.eps = cfg.num_heads, cfg.norm_eps
        self.norm1 = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.norm2 = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)


class MossBlock(_NormedBlock):
    def __init__(self, cfg: MossConfig):
        super().__init__(cfg)
        self.proj = nn.ModuleDict({name: nn.Linear(cfg.dim, cfg.dim, bias=False) for name in "qkvo"})
        self.proj["ffn_up_gate"] = nn.Linear(cfg.dim, 2 * cfg.mlp_hidden, bias=False)
        self.proj["ffn_down"] = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=False)

    def qkv_linears(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        return self.proj["q"], self.proj["k"], self.proj["v"]

    def project_qkv(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of y. adapters/fast.py may set a grouped version on the instance (one op for the
        three LoRA linears that read y); it computes the same."""
        return tuple(linear(y) for linear in self.qkv_linears())

    def attention_half(
        self, x: torch.Tensor, mod: torch.Tensor, seq: PackedSeq, rope: tuple[torch.Tensor, torch.Tensor], ops
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x after the attention residual, and the MLP's modulated input y (the next norm fused in)."""
        shift_a, scale_a, gate_a, shift_f, scale_f, _ = mod.unbind(0)
        ts, eps = seq.token_sample, self.eps
        scale_a = fold_norm_weight(self.norm1.weight, scale_a)
        scale_f = fold_norm_weight(self.norm2.weight, scale_f)
        y, x = ops.norm_modulate(x, shift_a, scale_a, ts, eps, fork=True)  # x's two gradients in one pass
        q, k, v = self.project_qkv(y)
        cache = getattr(seq, "reference_kv", None)  # the sampler's reference K/V (model/reference_kv.py)
        out = attention(
            q, k, v, self.q_norm, self.k_norm, rope, seq.cu_seqlens, seq.max_seqlen, self.num_heads, eps, ops,
            seq.attention_segments, None if cache is None else partial(cache, self),
        )  # fmt: skip
        return ops.residual_norm_modulate(x, self.proj["o"](out), gate_a, shift_f, scale_f, ts, eps)

    def mlp_half(
        self, x: torch.Tensor, y: torch.Tensor, mod: torch.Tensor, seq: PackedSeq, ops
    ) -> torch.Tensor:
        """x after the SiTU-GLU residual."""
        p = self.proj
        return ops.gated_residual(
            x, p["ffn_down"](ops.situ_glu(p["ffn_up_gate"](y))), mod[5], seq.token_sample
        )

    def forward(
        self,
        x: torch.Tensor,
        mod: torch.Tensor,
        seq: PackedSeq,
        rope: tuple[torch.Tensor, torch.Tensor],
        ops,
    ) -> torch.Tensor:
        """x [T, d]; mod [6, B, d] the shared modulation (shift_a, scale_a, gate_a, shift_f, scale_f, gate_f).
        Memory engines may checkpoint either half alone (memory/engines/checkpointing.py)."""
        x, y = self.attention_half(x, mod, seq, rope, ops)
        return self.mlp_half(x, y, mod, seq, ops)


class TextRefinerBlock(_NormedBlock):
    def __init__(self, cfg: MossConfig):
        super().__init__(cfg)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)  # rows q; k; v
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ffn_gate = nn.Linear(cfg.dim, cfg.mlp_hidden)
        self.ffn_up = nn.Linear(cfg.dim, cfg.mlp_hidden)
        self.ffn_down = nn.Linear(cfg.mlp_hidden, cfg.dim)

    def forward(
        self, x: torch.Tensor, seq: PackedSeq, rope: tuple[torch.Tensor, torch.Tensor], ops
    ) -> torch.Tensor:
        """x [T_text, d] (the packed text tokens); rope: cos, sin of the text tokens."""
        eps = self.eps
        q, k, v = (t.contiguous() for t in self.qkv(ops.rms_norm(x, self.norm1.weight, eps)).chunk(3, -1))
        out = attention(
            q, k, v, self.q_norm, self.k_norm, rope, seq.text_cu_seqlens, seq.text_max_seqlen,
            self.num_heads, eps, ops,
        )  # fmt: skip
        x = x + self.proj(out)
        y = ops.rms_norm(x, self.norm2.weight, eps)
        return x + self.ffn_down(ops.situ_glu(torch.cat([self.ffn_up(y), self.ffn_gate(y)], dim=-1)))


class TextEmbedder(nn.Module):
    """`text_embedder`: the text encoder's states projected to d, then the refiner blocks."""

    def __init__(self, cfg: MossConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.text_dim, cfg.dim)
        self.blocks = nn.ModuleList(TextRefinerBlock(cfg) for _ in range(cfg.refiner_depth))

    def forward(
        self,
        text: torch.Tensor,
        seq: PackedSeq,
        rope: tuple[torch.Tensor, torch.Tensor],
        ops,
        residual_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """residual_dtype: the refiner's residual stream's dtype (MossBackbone.residual_dtype)."""
        x = self.proj(text.to(self.proj.weight.dtype))
        x = x if residual_dtype is None else x.to(residual_dtype)
        for block in self.blocks:
            x = block(x, seq, rope, ops)
        return x
