"""The padded reference forward: MOSS-Image written for clarity, one padded batch, no kernels.

This is the ground truth the packed forward, every kernel and every memory engine are checked against,
and the one checked against an independent port of the released model (tests/model/test_port_parity.py).
It reads the weights of a MossBackbone but none of its code paths: every op is spelled out here with plain
torch on a [B, L_max, d] batch and a key-padding mask, following the released code's order of operations.

Reference images (edit training) follow SimpleTuner's MOSS edit transformer
(../shared/spec/moss-image-edit-facts.md 1.3): per sample [image, text, references, padding], the
references through video_embedder, at (m, n_text, centred row, centred col) for reference m = 1..M,
modulated with t = 0, their queries masked to reference keys, no output for them.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from torch import nn

from .backbone import MossBackbone
from .embed import timestep_features
from .rope import rope_bands
from .seq import reference_positions, sample_positions


def _rms(x: torch.Tensor, norm: nn.RMSNorm, eps: float) -> torch.Tensor:
    """Normalised in float32, rounded to x's dtype, then times the weight (the released rounding order)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype) * norm.weight


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    out = x @ layer.weight.t()
    return out + layer.bias if layer.bias is not None else out


def _situ(hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return (4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate)) * (25.0 * torch.tanh(hidden / 25.0))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D]; cos, sin [B, L, D/2]: rotate-half, pair (i, i + D/2) by frequency i."""
    cos = torch.cat([cos, cos], -1)[:, :, None, :].to(x.dtype)
    sin = torch.cat([sin, sin], -1)[:, :, None, :].to(x.dtype)
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def _attention(q, k, v, q_norm, k_norm, cos, sin, bias, heads: int, eps: float) -> torch.Tensor:
    B, L, d = q.shape
    D = d // heads
    q = _rotate(_rms(q.view(B, L, heads, D), q_norm, eps), cos, sin)
    k = _rotate(_rms(k.view(B, L, heads, D), k_norm, eps), cos, sin)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.to(q.dtype)) / math.sqrt(D) + bias
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.view(B, L, heads, D)).reshape(B, L, d)


def _pad_bias(lengths: list[int], L: int, dtype, device) -> torch.Tensor:
    valid = torch.arange(L, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    return torch.zeros(len(lengths), 1, 1, L, dtype=dtype, device=device).masked_fill(
        ~valid[:, None, None, :], float("-inf")
    )


def _block_bias(lengths: list[int], is_ref: torch.Tensor, dtype) -> torch.Tensor:
    """[B, 1, L, L]: key padding masked, and a reference query's image and text keys."""
    B, L = is_ref.shape
    valid = (
        torch.arange(L, device=is_ref.device)[None, :] < torch.tensor(lengths, device=is_ref.device)[:, None]
    )
    allowed = valid[:, None, :] & (~is_ref[:, :, None] | is_ref[:, None, :])
    return torch.zeros(B, 1, L, L, dtype=dtype, device=is_ref.device).masked_fill(
        ~allowed[:, None], float("-inf")
    )


def reference_forward(
    model: MossBackbone,
    imgs: list[torch.Tensor],
    texts: list[torch.Tensor],
    img_sizes: list[tuple[int, int]],
    sigma: torch.Tensor,
    skip_layers: Collection[int] = (),
    refs: list[list[torch.Tensor]] | None = None,
    ref_sizes: list[list[tuple[int, int]]] | None = None,
    grad: bool = False,
) -> list[torch.Tensor]:
    """Per sample: imgs[b] [rows*cols, in_channels], texts[b] [n_text, text_dim], refs[b] a list of
    [rows*cols, in_channels] reference tokens with ref_sizes[b] their grids. Returns v per sample.
    grad: keep the autograd graph (gradient parity tests); the default runs under no_grad."""
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return _reference_forward(model, imgs, texts, img_sizes, sigma, skip_layers, refs, ref_sizes)


def _time(model: MossBackbone, sigma: torch.Tensor, dtype) -> torch.Tensor:
    cfg, te = model.config, model.time_embedding
    feats = timestep_features(sigma, cfg.time_freq_dim, cfg.time_scale).to(dtype)
    return _linear(nn.functional.silu(_linear(feats, te[0])), te[2])


def _reference_forward(
    model, imgs, texts, img_sizes, sigma, skip_layers, refs, ref_sizes
) -> list[torch.Tensor]:
    cfg = model.config
    B, H, eps = len(imgs), cfg.num_heads, cfg.norm_eps
    has_refs = refs is not None and any(len(r) for r in refs)
    if has_refs and (ref_sizes is None or [len(r) for r in refs] != [len(s) for s in ref_sizes]):
        raise ValueError("refs and ref_sizes must list the same references per sample")
    n_img = [i.shape[0] for i in imgs]
    n_text = [t.shape[0] for t in texts]
    n_ref = [sum(r.shape[0] for r in refs[b]) for b in range(B)] if has_refs else [0] * B
    lengths = [n_img[b] + n_text[b] + n_ref[b] for b in range(B)]
    L, Lt = max(lengths), max(n_text)
    dtype, device = model.video_embedder.weight.dtype, imgs[0].device

    # rotary phases in float32, per sample laid out as [image, text, references, padding]
    bands = rope_bands(cfg.head_dim, cfg.rope_theta, device)
    cos = torch.zeros(B, L, cfg.head_dim // 2, device=device)
    sin = torch.zeros_like(cos)
    for b in range(B):
        pi, pt = sample_positions(n_text[b], *img_sizes[b])
        parts = [pi, pt] + ([reference_positions(n_text[b], ref_sizes[b])] if has_refs else [])
        phase = (torch.cat(parts).to(device)[:, :, None] * bands).flatten(1)
        cos[b, : lengths[b]], sin[b, : lengths[b]] = phase.cos(), phase.sin()

    # time -> shared block modulation and head modulation (no SiLU before either)
    time = _time(model, sigma, dtype)
    mod = _linear(time, model.shared_block_modulation)[:, None, :].chunk(6, -1)
    head_shift, head_scale = _linear(time, model.video_head_modulation)[:, None, :].chunk(2, -1)
    if has_refs:  # reference tokens take the t = 0 modulation, every other token its sample's
        is_ref = torch.zeros(B, L, dtype=torch.bool, device=device)
        for b in range(B):
            is_ref[b, n_img[b] + n_text[b] : lengths[b]] = True
        clean = _linear(_time(model, sigma.new_zeros(1), dtype), model.shared_block_modulation)
        mod = tuple(
            torch.where(is_ref[:, :, None], c[:, None, :], m) for m, c in zip(mod, clean.chunk(6, -1))
        )

    # text: projection, then the refiner blocks over each sample's text alone (positions (0, j, 0, 0))
    txt = torch.zeros(B, Lt, cfg.dim, dtype=dtype, device=device)
    for b in range(B):
        txt[b, : n_text[b]] = _linear(texts[b].to(dtype), model.text_embedder.proj)
    _, text_pos = sample_positions(Lt, 1, 1)
    t_phase = (text_pos.to(device)[:, :, None] * bands).flatten(1)
    t_cos, t_sin = t_phase.cos().expand(B, -1, -1), t_phase.sin().expand(B, -1, -1)
    t_bias = _pad_bias(n_text, Lt, dtype, device)
    for blk in model.text_embedder.blocks:
        q, k, v = _linear(_rms(txt, blk.norm1, eps), blk.qkv).chunk(3, -1)
        txt = txt + _linear(
            _attention(q, k, v, blk.q_norm, blk.k_norm, t_cos, t_sin, t_bias, H, eps), blk.proj
        )
        y = _rms(txt, blk.norm2, eps)
        txt = txt + _linear(_situ(_linear(y, blk.ffn_up), _linear(y, blk.ffn_gate)), blk.ffn_down)

    x = torch.zeros(B, L, cfg.dim, dtype=dtype, device=device)
    for b in range(B):
        x[b, : n_img[b]] = _linear(imgs[b].to(dtype), model.video_embedder)
        x[b, n_img[b] : n_img[b] + n_text[b]] = txt[b, : n_text[b]]
        if has_refs and n_ref[b]:
            ref_tokens = torch.cat([r.to(dtype) for r in refs[b]])
            x[b, n_img[b] + n_text[b] : lengths[b]] = _linear(ref_tokens, model.video_embedder)
    bias = _block_bias(lengths, is_ref, dtype) if has_refs else _pad_bias(lengths, L, dtype, device)

    shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mod
    for i, blk in enumerate(model.layers):
        if i in skip_layers:
            continue
        p = blk.proj
        y = _rms(x, blk.norm1, eps) * (1 + scale_a) + shift_a
        out = _attention(_linear(y, p["q"]), _linear(y, p["k"]), _linear(y, p["v"]),
                         blk.q_norm, blk.k_norm, cos, sin, bias, H, eps)  # fmt: skip
        x = x + _linear(out, p["o"]) * gate_a
        y = _rms(x, blk.norm2, eps) * (1 + scale_f) + shift_f
        hidden, gate = _linear(y, p["ffn_up_gate"]).chunk(2, -1)
        x = x + _linear(_situ(hidden, gate), p["ffn_down"]) * gate_f

    y = _rms(x, model.final_norm_video, eps) * (1 + head_scale) + head_shift
    out = _linear(y, model.final_linear_video)
    return [out[b, : n_img[b]] for b in range(B)]
