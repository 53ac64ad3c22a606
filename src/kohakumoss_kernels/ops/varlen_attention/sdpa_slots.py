"""Varlen attention for samples in equal slots: each slot's image keys in one dense SDPA call, merged with the rest.

`PackedSeq.build` lays a batch of equal-size images out in slots of `stride` tokens, [image, text, pad],
and registers (stride, prefix) on its cu_seqlens (`host_values.register_slots`); cu_seqlens alternates
each sample's segment and its pad's. Every real query of a slot sees all `prefix` image keys of its
slot, so that part is one unmasked SDPA call, [B, H, stride, D] queries x [B, H, prefix, D] keys
(cuDNN, else flash: fixed shapes, ~97% of the FLOPs at 1 MP). The slot's other keys (text, then pad) go
through one masked SDPA call: real queries see the real text keys, pad queries only the pad keys
(and no image key). The parts are merged by their log-sum-exps,

    lse = logaddexp(lse_a, lse_b),   o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse)

(one Triton pass on CUDA, `slot_merge.py`), and each part's backward is its kernel's own, given the
merged o and lse (as ring attention does): P = exp(S - lse) and dS = P (dP - rowsum(dO o)) hold per part. The text lengths are read on the
device (from cu_seqlens), so one CUDA graph replays every batch whose captions fit the slot.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ...host_values import slots

aten = torch.ops.aten


def supports(arch: str, dtype: torch.dtype) -> bool:
    """CUDA: cuDNN / flash for the image keys and the memory-efficient kernel for the rest (16-bit);
    the CPU: torch's flash kernel for the CPU, which takes masks too (the tests run it)."""
    return arch == "cpu" or dtype in (torch.float16, torch.bfloat16)


def accepts(q: torch.Tensor, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, *args, **kwargs) -> bool:
    """Only batches laid out in slots (others: the op's other backends)."""
    layout = slots(cu_seqlens)
    return layout is not None and layout[0] * ((cu_seqlens.numel() - 1) // 2) == q.shape[0]


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    """q, k, v [T, H, D] in slots (`accepts`)."""
    layout = slots(cu_seqlens)
    if layout is None:
        raise RuntimeError(
            "sdpa_slots: cu_seqlens has no slot layout (PackedSeq.build with pad_to and one image size)"
        )
    stride, prefix = layout
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if q.device.type != "cuda":
        kernels = "cpu"
    else:  # flash where torch has no cuDNN: 1.5x cuDNN's time on the H200 (docs/performance/kernels.md)
        kernels = "cudnn" if torch.backends.cudnn.is_available() else "flash"
    return _SlotAttention.apply(q, k, v, cu_seqlens, stride, prefix, float(scale), kernels)


varlen_attention.device_lengths = True  # text lengths read on the device: graph-safe across captions
varlen_attention.accepts = accepts


def _masks(cu: torch.Tensor, stride: int, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(real rows [B, S] bool, allowed [B, S, S - prefix] bool: which of the slot's text and pad keys each
    query sees; a real row the real text keys, a pad row the pad keys)."""
    real_len = (cu[1::2] - cu[0:-1:2]).long()  # each sample's own segment (image + text)
    pos = torch.arange(stride, device=cu.device)
    real_rows = pos[None] < real_len[:, None]
    return real_rows, real_rows[:, :, None] == real_rows[:, None, prefix:]


def _bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, S, L] (expanded over heads by the caller): 0 where allowed, -inf elsewhere; its rows padded to 16 elements in
    memory (the memory-efficient kernel's alignment), as F.scaled_dot_product_attention pads them."""
    B, S, L = allowed.shape
    bias = torch.zeros(B, 1, S, -(-L // 16) * 16, dtype=dtype, device=allowed.device)[..., :L]
    return bias.masked_fill_(~allowed[:, None], float("-inf"))


def merge_torch(o_a, o_b, lse_a, lse_b, real_rows, out) -> torch.Tensor:
    """The merge (reference; the CPU's path): o_a, o_b, out [B, H, S, D]; lse_a, lse_b [B, H, S];
    real_rows [B, S]. Writes out, returns the merged lse [B, H, S] float32."""
    lse_a = lse_a.float().masked_fill(~real_rows[:, None], float("-inf"))  # pad rows see no image key
    lse = torch.logaddexp(lse_a, lse_b.float())
    o_b = o_b.float()
    out.copy_(torch.addcmul(o_b, torch.exp(lse_a - lse).unsqueeze(-1), o_a.float() - o_b))
    return lse


@functools.cache
def _fused_merge():
    """slot_merge's Triton kernel, or None (no Triton)."""
    try:
        from . import slot_merge
    except ImportError:
        return None
    return slot_merge


def _merge(o_a, o_b, lse_a, lse_b, real_rows, out) -> torch.Tensor:
    fused = _fused_merge() if out.is_cuda else None
    if fused is not None and fused.fits(o_a, o_b, lse_a, lse_b, out):
        return fused.merge(o_a, o_b, lse_a, lse_b, real_rows, out)
    return merge_torch(o_a, o_b, lse_a, lse_b, real_rows, out)


# Each kernel: forward (q, k, v, bias, scale) -> (o [B, H, S, D], lse [B, H, S] float32, saved) and
# backward (do, q, k, v, bias, o, lse [B, H, S], saved, scale) -> (dq, dk, dv), lse in its own layout.


def _cpu_forward(q, k, v, bias, scale):
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=scale
    )
    return o, lse, ()


def _cpu_backward(do, q, k, v, bias, o, lse, saved, scale):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, q, k, v, o, lse, 0.0, False, attn_mask=bias, scale=scale
    )


def _cudnn_forward(q, k, v, bias, scale):
    o, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, False, False, scale=scale
    )
    return o, lse.reshape(q.shape[:3]), (lse.shape, cq, ck, mq, mk, seed, offset)


def _cudnn_backward(do, q, k, v, bias, o, lse, saved, scale):
    shape, cq, ck, mq, mk, seed, offset = saved
    return aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.reshape(shape), seed, offset, None, cq, ck, mq, mk, 0.0, False, scale=scale
    )


def _flash_forward(q, k, v, bias, scale):
    o, lse, cq, ck, mq, mk, rng, unused, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, False, False, scale=scale
    )
    return o, lse, (cq, ck, mq, mk, rng, unused)


def _flash_backward(do, q, k, v, bias, o, lse, saved, scale):
    cq, ck, mq, mk, rng, unused = saved
    return aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, cq, ck, mq, mk, 0.0, False, rng, unused, scale=scale
    )


def _efficient_forward(q, k, v, bias, scale):
    o, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, False, scale=scale
    )
    S = q.shape[2]
    return o, lse[..., :S], (lse.shape[-1] - S, seed, offset)  # its lse rows are padded to 32


def _efficient_backward(do, q, k, v, bias, o, lse, saved, scale):
    pad, seed, offset = saved
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, bias, o, F.pad(lse, (0, pad)), seed, offset, 0.0, [True, True, True, False], False,
        scale=scale,
    )  # fmt: skip
    return dq, dk, dv


# kernels name -> (image keys: forward, backward), (text and pad keys, masked: forward, backward)
KERNELS = {
    "cpu": ((_cpu_forward, _cpu_backward), (_cpu_forward, _cpu_backward)),
    "cudnn": ((_cudnn_forward, _cudnn_backward), (_efficient_forward, _efficient_backward)),
    "flash": ((_flash_forward, _flash_backward), (_efficient_forward, _efficient_backward)),
}


def _slot_view(t: torch.Tensor, stride: int) -> torch.Tensor:
    """[T, H, D] -> [B, H, stride, D], a view."""
    return t.view(-1, stride, *t.shape[1:]).transpose(1, 2)


class _SlotAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, stride, prefix, scale, kernels):
        (img_fwd, _), (rest_fwd, _) = KERNELS[kernels]
        qs, ks, vs = (_slot_view(t, stride) for t in (q, k, v))
        real_rows, allowed = _masks(cu_seqlens, stride, prefix)
        bias = _bias(allowed, q.dtype).expand(-1, q.shape[1], -1, -1)  # the kernels want a head dimension
        o_a, lse_a, saved_a = img_fwd(qs, ks[:, :, :prefix], vs[:, :, :prefix], None, scale)
        o_b, lse_b, saved_b = rest_fwd(qs, ks[:, :, prefix:], vs[:, :, prefix:], bias, scale)
        out = torch.empty_like(q)  # [T, H, D]; its slot view is the kernels' [B, H, S, D] layout
        lse = _merge(o_a, o_b, lse_a, lse_b, real_rows, _slot_view(out, stride))
        ctx.save_for_backward(q, k, v, out, lse, real_rows, bias)
        ctx.layout, ctx.scale, ctx.kernels, ctx.saved = (stride, prefix), scale, kernels, (saved_a, saved_b)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, real_rows, bias = ctx.saved_tensors
        (stride, prefix), scale = ctx.layout, ctx.scale
        (_, img_bwd), (_, rest_bwd) = KERNELS[ctx.kernels]
        saved_a, saved_b = ctx.saved
        qs, ks, vs, o = (_slot_view(t, stride) for t in (q, k, v, out))
        do = _slot_view(grad_out.contiguous(), stride)
        do_a = do.masked_fill(~real_rows[:, None, :, None], 0)  # the pad rows took no image key
        dq_a, dk_a, dv_a = img_bwd(
            do_a, qs, ks[:, :, :prefix], vs[:, :, :prefix], None, o, lse, saved_a, scale
        )
        dq_b, dk_b, dv_b = rest_bwd(
            do, qs, ks[:, :, prefix:], vs[:, :, prefix:], bias, o, lse, saved_b, scale
        )
        dq = torch.empty_like(q)
        _slot_view(dq, stride).copy_(dq_a + dq_b)
        grads = []
        for part_a, part_b in ((dk_a, dk_b), (dv_a, dv_b)):
            g = torch.empty_like(q)
            _slot_view(g, stride)[:, :, :prefix].copy_(part_a)
            _slot_view(g, stride)[:, :, prefix:].copy_(part_b)
            grads.append(g)
        return dq, *grads, None, None, None, None, None
