"""The padded reference forward: MOSS-Image written for clarity, one padded batch, no kernels.

This is the ground truth the packed forward, every kernel and every memory engine are checked
against. It reads the weights of a MossBackbone but none of its code paths: every op is spelled
out here with plain torch on a [B, L_max, d] batch and a key-padding mask.
"""

from __future__ import annotations

import math

import torch

from .backbone import MossBackbone


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return out * weight if weight is not None else out


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    out = x @ layer.weight.t()
    return out + layer.bias if layer.bias is not None else out


def _positions(n_text: int, rows: int, cols: int) -> torch.Tensor:
    """(text index, row, column) for [text tokens, image tokens in row-major order]."""
    pos = [(j, 0, 0) for j in range(n_text)]
    pos += [(n_text, r, c) for r in range(rows) for c in range(cols)]
    return torch.tensor(pos, dtype=torch.float64)


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D]; angles [B, L, D/2]: rotate pair (i, i + D/2) by angle i."""
    half = x.shape[-1] // 2
    cos, sin = angles.cos()[:, :, None, :].to(x.dtype), angles.sin()[:, :, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@torch.no_grad()
def reference_forward(
    model: MossBackbone,
    imgs: list[torch.Tensor],
    texts: list[torch.Tensor],
    img_sizes: list[tuple[int, int]],
    sigma: torch.Tensor,
) -> list[torch.Tensor]:
    """Per sample: imgs[b] [rows*cols, in_channels], texts[b] [n_text, text_dim]. Returns v per sample."""
    cfg = model.config
    B = len(imgs)
    n_text = [t.shape[0] for t in texts]
    lengths = [n_text[b] + imgs[b].shape[0] for b in range(B)]
    L = max(lengths)
    dtype, device = imgs[0].dtype, imgs[0].device

    # embed both streams and lay each sample out as [text, image, padding]
    x = torch.zeros(B, L, cfg.dim, dtype=dtype, device=device)
    angles = torch.zeros(B, L, cfg.head_dim // 2, dtype=torch.float64, device=device)
    for b in range(B):
        txt = _rms(texts[b], model.txt_norm.weight if model.txt_norm is not None else None, cfg.norm_eps)
        x[b, : n_text[b]] = _linear(txt, model.txt_in)
        x[b, n_text[b] : lengths[b]] = _linear(imgs[b], model.img_in)
        pos = _positions(n_text[b], *img_sizes[b]).to(device)
        parts, offset = [], 0
        for axis, size in enumerate(cfg.rope_axes):
            inv_freq = 1.0 / (
                cfg.rope_theta ** (torch.arange(0, size, 2, dtype=torch.float64, device=device) / size)
            )
            parts.append(pos[:, axis : axis + 1] * inv_freq[None, :])
            offset += size
        angles[b, : lengths[b]] = torch.cat(parts, dim=1)
    valid = torch.zeros(B, L, dtype=torch.bool, device=device)
    for b in range(B):
        valid[b, : lengths[b]] = True
    attn_bias = torch.zeros(B, 1, 1, L, dtype=dtype, device=device).masked_fill(
        ~valid[:, None, None, :], float("-inf")
    )

    # timestep embedding -> AdaLN input
    half = cfg.time_freq_dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=device) / half)
    args = (sigma.float() * cfg.time_scale)[:, None] * freqs[None, :]
    t = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(dtype)
    t = _linear(torch.nn.functional.silu(_linear(t, model.time_embed.linear_1)), model.time_embed.linear_2)
    mod_in = torch.nn.functional.silu(t)  # [B, mod_dim]

    H, D = cfg.num_heads, cfg.head_dim
    for block in model.blocks:
        mod = _linear(mod_in, block.modulation)[:, None, :]  # [B, 1, 6d]
        shift1, scale1, gate1, shift2, scale2, gate2 = mod.chunk(6, dim=-1)

        h = _rms(x, None, cfg.norm_eps) * (1 + scale1) + shift1
        attn = block.attn
        q = _linear(h, attn.q_proj).view(B, L, H, D)
        k = _linear(h, attn.k_proj).view(B, L, H, D)
        v = _linear(h, attn.v_proj).view(B, L, H, D)
        if attn.q_norm is not None:
            q, k = _rms(q, attn.q_norm.weight, cfg.norm_eps), _rms(k, attn.k_norm.weight, cfg.norm_eps)
        q, k = _rotate(q, angles), _rotate(k, angles)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D) + attn_bias
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v).reshape(B, L, H * D)
        x = x + gate1 * _linear(out, attn.o_proj)

        h = _rms(x, None, cfg.norm_eps) * (1 + scale2) + shift2
        mlp = block.mlp
        if cfg.mlp_act == "swiglu":
            gate, up = _linear(h, mlp.gate_up_proj).chunk(2, dim=-1)
            inner = torch.nn.functional.silu(gate) * up
        else:
            inner = torch.nn.functional.gelu(_linear(h, mlp.up_proj), approximate="tanh")
        x = x + gate2 * _linear(inner, mlp.down_proj)

    shift, scale = _linear(mod_in, model.final.modulation)[:, None, :].chunk(2, dim=-1)
    out = _linear(_rms(x, None, cfg.norm_eps) * (1 + scale) + shift, model.final.proj)
    return [out[b, n_text[b] : lengths[b]] for b in range(B)]
