"""Session 11 scratch (not committed): qk_norm_rope forward variants, and cache hints on row kernels."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels.ops.qk_norm_rope.triton import _cos_sin  # noqa: E402
from kohakumoss_kernels.ops.qk_norm_rope.triton import _qk_norm_rope_fwd  # noqa: E402
from kohakumoss_kernels.triton_utils import device_ms  # noqa: E402


@triton.jit
def _fwd_hint(X, W, COS, SIN, OUT, RSTD, R, H, half, eps, ROWS: tl.constexpr, BD: tl.constexpr, HINT: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    rmask = rid < R - row0
    cmask = cols < half
    mask = rmask[:, None] & cmask[None, :]
    loc = rid[:, None] * (2 * half) + cols[None, :]
    base = X + row0 * (2 * half)
    if HINT:
        x1 = tl.load(base + loc, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        x2 = tl.load(base + loc + half, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        x1 = tl.load(base + loc, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + loc + half, mask=mask, other=0.0).to(tl.float32)
    c, s = _cos_sin(COS, SIN, row0, rid, H, half, cols, mask)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)
    n1 = x1 * rstd[:, None] * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    n2 = x2 * rstd[:, None] * tl.load(W + half + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    n1 = n1.to(OUT.dtype.element_ty).to(tl.float32)
    n2 = n2.to(OUT.dtype.element_ty).to(tl.float32)
    out = OUT + row0 * (2 * half)
    if HINT:
        tl.store(out + loc, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=".cs")
        tl.store(out + loc + half, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        tl.store(out + loc, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out + loc + half, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)


@triton.jit
def _fwd_full(X, W, COS, SIN, OUT, RSTD, R, H, half, eps, ROWS: tl.constexpr, BD: tl.constexpr):
    """Whole 128-wide rows: one contiguous load, the rotation partner a second load of the same lines."""
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, 2 * BD)
    rmask = rid < R - row0
    mask = rmask[:, None] & (cols < 2 * half)[None, :]
    loc = rid[:, None] * (2 * half) + cols[None, :]
    partner = rid[:, None] * (2 * half) + ((cols + half) % (2 * half))[None, :]
    base = X + row0 * (2 * half)
    x = tl.load(base + loc, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(base + partner, mask=mask, other=0.0).to(tl.float32)
    tok0 = row0 // H
    off = ((row0 - tok0 * H).to(tl.int32) + rid)[:, None] // H * half + (cols % half)[None, :]
    c = tl.load(COS + tok0 * half + off, mask=mask, other=0.0)
    s = tl.load(SIN + tok0 * half + off, mask=mask, other=0.0)
    s = tl.where((cols < half)[None, :], -s, s)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / (2 * half) + eps)
    w = tl.load(W + cols, mask=cols < 2 * half, other=0.0).to(tl.float32)[None, :]
    wp = tl.load(W + (cols + half) % (2 * half), mask=cols < 2 * half, other=0.0).to(tl.float32)[None, :]
    n = (x * rstd[:, None] * w).to(OUT.dtype.element_ty).to(tl.float32)
    npart = (xp * rstd[:, None] * wp).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row0 * (2 * half) + loc, (n * c + npart * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)


T, H, D = 8704, 24, 128
R = T * H
dev = "cuda"
if os.environ.get("TRITON_INTERPRET") == "1":
    T, dev = 8, "cpu"
    R = T * H

    def device_ms(fn, reps=1):  # noqa: F811
        fn()
        return 0.0

g = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, generator=g)
w = torch.randn(D, device=dev, dtype=torch.bfloat16, generator=g)
ang = torch.rand(T, D // 2, device=dev, generator=g) * 6.28
cos, sin = ang.cos(), ang.sin()
rstd = torch.empty(T, H, device=dev)
outs = {}


def launch(kind, rows, warps):
    out = torch.empty_like(x)
    outs[(kind, rows, warps)] = out
    grid = (triton.cdiv(R, rows),)
    if kind == "cur":
        return lambda: _qk_norm_rope_fwd[grid](x, w, cos, sin, out, rstd, R, H, D // 2, 1e-6, HAS_W=True, ROWS=rows, BD=64, num_warps=warps)
    if kind in ("plain", "hint"):
        return lambda: _fwd_hint[grid](x, w, cos, sin, out, rstd, R, H, D // 2, 1e-6, ROWS=rows, BD=64, HINT=kind == "hint", num_warps=warps)
    return lambda: _fwd_full[grid](x, w, cos, sin, out, rstd, R, H, D // 2, 1e-6, ROWS=rows, BD=64, num_warps=warps)


src = torch.empty(T * H * D, device=dev, dtype=torch.bfloat16)
dst = torch.empty_like(src)
print(f"copy {2 * src.numel() * 2 / 1e6:.0f} MB: {device_ms(lambda: dst.copy_(src), reps=20) * 1e3:.1f} us", flush=True)
for rows, warps in [(8, 4), (16, 4), (16, 8), (32, 4), (32, 8), (64, 8)]:
    row = []
    for kind in ("cur", "plain", "hint", "full"):
        f = launch(kind, rows, warps)
        row.append(device_ms(f, reps=20) * 1e3)
    same = all(torch.equal(outs[("cur", rows, warps)], outs[(k, rows, warps)]) for k in ("plain", "hint"))
    full = (outs[("cur", rows, warps)].float() - outs[("full", rows, warps)].float()).abs().max().item()
    print(f"{rows:3} x {warps:2}: cur {row[0]:.1f} plain {row[1]:.1f} hint {row[2]:.1f} full {row[3]:.1f}  "
          f"(same {same}, full max diff {full:.3g})", flush=True)
