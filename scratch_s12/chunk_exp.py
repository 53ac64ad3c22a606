"""Session 12 scratch experiment: d = 3072 rows held as 3 chunks of 1024 (no padding to 4096) against the
shipped one-BLOCK kernels (norm_modulate forward and backward, rms_norm forward)."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels import sample_sums as ss  # noqa: E402
from kohakumoss_kernels.ops.norm_modulate import triton as nmt  # noqa: E402
from kohakumoss_kernels.ops.rms_norm import triton as rnt  # noqa: E402
from kohakumoss_kernels.triton_utils import (  # noqa: E402
    backward_configs, device_ms, persistent_programs, register_budget, row_configs,
)


@triton.jit
def _ld3(P, base, cols, W: tl.constexpr, m0, m1, m2):
    a = tl.load(P + base + cols, mask=m0, other=0.0)
    b = tl.load(P + base + W + cols, mask=m1, other=0.0)
    c = tl.load(P + base + 2 * W + cols, mask=m2, other=0.0)
    return a, b, c


@triton.jit
def _nm_fwd_c(X, SHIFT, SCALE, TS, Y, RSTD, T, d, eps, ROWS: tl.constexpr, W: tl.constexpr, HOLD: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, W)[None, :]
    rmask = (rid < T - row0)[:, None]
    m0 = rmask & (cols < d)
    m1 = rmask & (cols + W < d)
    m2 = rmask & (cols + 2 * W < d)
    loc = rid[:, None] * d
    s = tl.load(TS + row0 + rid, mask=rid < T - row0, other=0).to(tl.int32)
    x0, x1, x2 = _ld3(X + row0 * d, loc, cols, W, m0, m1, m2)
    x0, x1, x2 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x0 * x0, axis=1) + tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / d + eps)
    r = rstd[:, None]
    p = s[:, None] * d
    c0, c1, c2 = _ld3(SCALE, p, cols, W, m0, m1, m2)
    h0, h1, h2 = _ld3(SHIFT, p, cols, W, m0, m1, m2)
    ty = Y.dtype.element_ty
    tl.store(Y + row0 * d + loc + cols, (x0 * r * (1.0 + c0.to(tl.float32)) + h0.to(tl.float32)).to(ty), mask=m0)
    tl.store(Y + row0 * d + loc + W + cols, (x1 * r * (1.0 + c1.to(tl.float32)) + h1.to(tl.float32)).to(ty), mask=m1)
    tl.store(Y + row0 * d + loc + 2 * W + cols, (x2 * r * (1.0 + c2.to(tl.float32)) + h2.to(tl.float32)).to(ty), mask=m2)
    tl.store(RSTD + row0 + rid, rstd, mask=rid < T - row0)


@triton.jit
def _rms_fwd_c(X, WT, Y, RSTD, T, d, eps, ROWS: tl.constexpr, W: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, W)[None, :]
    rmask = (rid < T - row0)[:, None]
    m0 = rmask & (cols < d)
    m1 = rmask & (cols + W < d)
    m2 = rmask & (cols + 2 * W < d)
    loc = rid[:, None] * d
    x0, x1, x2 = _ld3(X + row0 * d, loc, cols, W, m0, m1, m2)
    x0, x1, x2 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x0 * x0, axis=1) + tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / d + eps)
    r = rstd[:, None]
    w0, w1, w2 = _ld3(WT, 0, cols, W, cols < d, cols + W < d, cols + 2 * W < d)
    ty = Y.dtype.element_ty
    tl.store(Y + row0 * d + loc + cols, (x0 * r * w0.to(tl.float32)).to(ty), mask=m0)
    tl.store(Y + row0 * d + loc + W + cols, (x1 * r * w1.to(tl.float32)).to(ty), mask=m1)
    tl.store(Y + row0 * d + loc + 2 * W + cols, (x2 * r * w2.to(tl.float32)).to(ty), mask=m2)
    tl.store(RSTD + row0 + rid, rstd, mask=rid < T - row0)


@triton.jit
def _bwd_tile(X, DY, DRES, RSTD, TS, row, end, cols, d, W: tl.constexpr, HAS_RES: tl.constexpr):
    ok = row < end
    m0 = (cols < d) & ok
    m1 = (cols + W < d) & ok
    m2 = (cols + 2 * W < d) & ok
    x0, x1, x2 = _ld3(X + row * d, 0, cols, W, m0, m1, m2)
    g0, g1, g2 = _ld3(DY + row * d, 0, cols, W, m0, m1, m2)
    if HAS_RES:
        r0, r1, r2 = _ld3(DRES + row * d, 0, cols, W, m0, m1, m2)
    else:
        r0, r1, r2 = x0, x1, x2
    rstd = tl.load(RSTD + row, mask=ok, other=0.0)
    s = tl.load(TS + row, mask=ok, other=-1).to(tl.int64)
    return x0, x1, x2, g0, g1, g2, r0, r1, r2, rstd, s


@triton.jit
def _flush6(a0, a1, a2, b0, b1, b2, P, D, pid, cur, seg, d, W: tl.constexpr):
    c = tl.arange(0, W)
    ss.flush(a0, P, D, pid, 0, 2, cur, seg, d, c, c < d)
    ss.flush(a1, P, D, pid, 0, 2, cur, seg, d, c + W, c + W < d)
    ss.flush(a2, P, D, pid, 0, 2, cur, seg, d, c + 2 * W, c + 2 * W < d)
    ss.flush(b0, P, D, pid, 1, 2, cur, seg, d, c, c < d)
    ss.flush(b1, P, D, pid, 1, 2, cur, seg, d, c + W, c + W < d)
    ss.flush(b2, P, D, pid, 1, 2, cur, seg, d, c + 2 * W, c + 2 * W < d)


@triton.jit
def _nm_bwd_c(
    DY, X, SCALE, TS, RSTD, DX, DRES, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, SEG: tl.constexpr, W: tl.constexpr, HAS_RES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, W)[None, :]
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, 1)
    cur = first
    seg = pid * 0
    a0 = tl.zeros([1, W], dtype=tl.float32)
    a1 = tl.zeros([1, W], dtype=tl.float32)
    a2 = tl.zeros([1, W], dtype=tl.float32)
    b0 = tl.zeros([1, W], dtype=tl.float32)
    b1 = tl.zeros([1, W], dtype=tl.float32)
    b2 = tl.zeros([1, W], dtype=tl.float32)
    row = start
    x0n, x1n, x2n, g0n, g1n, g2n, r0n, r1n, r2n, rn, sn = _bwd_tile(X, DY, DRES, RSTD, TS, row, end, cols, d, W, HAS_RES)
    for _ in range(0, n):
        x0, x1, x2 = x0n.to(tl.float32), x1n.to(tl.float32), x2n.to(tl.float32)
        g0, g1, g2 = g0n.to(tl.float32), g1n.to(tl.float32), g2n.to(tl.float32)
        rstd = rn
        s = sn
        r0, r1, r2 = r0n, r1n, r2n
        cur_row = row
        row += 1
        x0n, x1n, x2n, g0n, g1n, g2n, r0n, r1n, r2n, rn, sn = _bwd_tile(X, DY, DRES, RSTD, TS, row, end, cols, d, W, HAS_RES)
        m0 = cols < d
        m1 = cols + W < d
        m2 = cols + 2 * W < d
        c0, c1, c2 = _ld3(SCALE, tl.maximum(s, 0) * d, cols, W, m0, m1, m2)
        h0 = x0 * rstd
        h1 = x1 * rstd
        h2 = x2 * rstd
        e0 = g0 * (1.0 + c0.to(tl.float32))
        e1 = g1 * (1.0 + c1.to(tl.float32))
        e2 = g2 * (1.0 + c2.to(tl.float32))
        k = (tl.sum(e0 * h0, axis=1) + tl.sum(e1 * h1, axis=1) + tl.sum(e2 * h2, axis=1))[:, None] / d
        ty = DX.dtype.element_ty
        o0 = rstd * (e0 - h0 * k)
        o1 = rstd * (e1 - h1 * k)
        o2 = rstd * (e2 - h2 * k)
        if HAS_RES:
            o0 += r0.to(tl.float32)
            o1 += r1.to(tl.float32)
            o2 += r2.to(tl.float32)
        tl.store(DX + cur_row * d + cols, o0.to(ty), mask=m0)
        tl.store(DX + cur_row * d + W + cols, o1.to(ty), mask=m1)
        tl.store(DX + cur_row * d + 2 * W + cols, o2.to(ty), mask=m2)
        if NEED_SUMS:
            if SEG:
                if (s != cur) & (s >= 0):
                    _flush6(a0, a1, a2, b0, b1, b2, P, D, pid, cur, seg, d, W)
                    a0 = tl.zeros([1, W], dtype=tl.float32)
                    a1 = tl.zeros([1, W], dtype=tl.float32)
                    a2 = tl.zeros([1, W], dtype=tl.float32)
                    b0 = tl.zeros([1, W], dtype=tl.float32)
                    b1 = tl.zeros([1, W], dtype=tl.float32)
                    b2 = tl.zeros([1, W], dtype=tl.float32)
                    seg += 1
                    cur = s
            a0 += g0 * h0
            a1 += g1 * h1
            a2 += g2 * h2
            b0 += g0
            b1 += g1
            b2 += g2
    if NEED_SUMS:
        c = tl.arange(0, W)
        ss.close(a0, P, pid, 0, 2, seg, d, c, c < d)
        ss.close(a1, P, pid, 0, 2, seg, d, c + W, c + W < d)
        ss.close(a2, P, pid, 0, 2, seg, d, c + 2 * W, c + 2 * W < d)
        ss.close(b0, P, pid, 1, 2, seg, d, c, c < d)
        ss.close(b1, P, pid, 1, 2, seg, d, c + W, c + W < d)
        ss.close(b2, P, pid, 1, 2, seg, d, c + 2 * W, c + 2 * W < d)
        ss.mark(FIRST, LAST, pid, n, first, cur, seg)


def main():
    T, d, B = 8704, 3072, 2
    dev = "cuda"
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    timer = device_ms
    if interp:
        T, d, dev = 40, 96, "cpu"

        def timer(fn, reps=1):
            fn()
            return 0.0
    W = triton.next_power_of_2(triton.cdiv(d, 3))
    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(T, d, device=dev, dtype=bf, generator=g)
    dy = torch.randn(T, d, device=dev, dtype=bf, generator=g)
    scale = (torch.randn(B, d, device=dev, dtype=bf, generator=g) * 0.1)
    shift = (torch.randn(B, d, device=dev, dtype=bf, generator=g) * 0.1)
    w = torch.randn(d, device=dev, dtype=bf, generator=g)
    ts = torch.repeat_interleave(torch.arange(B, device=dev), T // B)
    y = torch.empty_like(x)
    rstd = torch.empty(T, device=dev)
    dx = torch.empty_like(x)
    dres = torch.randn(T, d, device=dev, dtype=bf, generator=g)
    eps = 1e-6
    rows = []

    def fwd_old(cfg):
        r, wp = cfg
        return lambda: nmt._norm_modulate_fwd[(triton.cdiv(T, r),)](x, shift, scale, ts, y, rstd, T, d, eps, ROWS=r, BLOCK=triton.next_power_of_2(d), num_warps=wp)

    def fwd_new(cfg):
        r, wp = cfg
        return lambda: _nm_fwd_c[(triton.cdiv(T, r),)](x, shift, scale, ts, y, rstd, T, d, eps, ROWS=r, W=W, HOLD=False, num_warps=wp)

    def rms_old(cfg):
        r, wp = cfg
        return lambda: rnt._rms_norm_fwd[(triton.cdiv(T, r),)](x, w, y, rstd, T, d, eps, HAS_W=True, ROWS=r, BLOCK=triton.next_power_of_2(d), num_warps=wp)

    def rms_new(cfg):
        r, wp = cfg
        return lambda: _rms_fwd_c[(triton.cdiv(T, r),)](x, w, y, rstd, T, d, eps, ROWS=r, W=W, num_warps=wp)

    def bwd_old(cfg, sums, res=False):
        r, wp, per_sm = cfg
        tiles = triton.cdiv(T, r)
        grid = persistent_programs(x, tiles, per_sm)
        p, first, last, acc = ss.buffers(grid, B, 2, d, dev)
        return lambda: nmt._norm_modulate_bwd[(grid,)](
            dy, x, scale, ts, rstd, dx, dres if res else dx, int(res), p, acc, first, last, T, d, triton.cdiv(tiles, grid),
            NEED_SUMS=sums, ROWS=r, BLOCK=triton.next_power_of_2(d), num_warps=wp, **register_budget(x, wp, per_sm))

    def bwd_new(cfg, sums, seg=True, cap=True, out=None, res=False):
        r, wp, per_sm = cfg
        grid = persistent_programs(x, T, per_sm)
        p, first, last, acc = ss.buffers(grid, B, 2, d, dev)
        extra = register_budget(x, wp, per_sm) if cap else {}

        def run():
            _nm_bwd_c[(grid,)](dy, x, scale, ts, rstd, dx, dres if res else dx, p, acc, first, last, T, d, triton.cdiv(T, grid),
                               NEED_SUMS=sums, SEG=seg, W=W, HAS_RES=res, num_warps=wp, **extra)
            if out is not None:
                out.append(ss.finish(p, first, last, acc, torch.float32))
        return run

    # correctness first: forward, then the backward's dx and sums against the shipped kernels
    fwd_old((1, 4))()
    y_ref, r_ref = y.clone(), rstd.clone()
    fwd_new((1, 4))()
    print("fwd equal:", torch.equal(y, y_ref), torch.allclose(rstd, r_ref), flush=True)
    res = []
    f = bwd_new((1, 4, 2), True, out=res)
    f()
    dx_new = dx.clone()
    from kohakumoss_kernels.ops.norm_modulate.triton import _NormModulate  # noqa: F401
    launch = ss.PerSampleBackward(nmt._norm_modulate_bwd, (dy, x, scale, ts, rstd, dx, dx, 0), x, B, 2, True, torch.float32)
    launch((1, 4, 2))
    print("bwd dx equal:", torch.equal(dx, dx_new), "sums max diff:", (launch.sums - res[0]).abs().max().item(), flush=True)

    res2 = []
    bwd_new((1, 4, 2), True, out=res2, res=True)()
    dx_new = dx.clone()
    launch = ss.PerSampleBackward(nmt._norm_modulate_bwd, (dy, x, scale, ts, rstd, dx, dres, 1), x, B, 2, True, torch.float32)
    launch((1, 4, 2))
    print("fork dx max diff:", (dx.float() - dx_new.float()).abs().max().item(), "sums max diff:", (launch.sums - res2[0]).abs().max().item(), flush=True)
    copy_src = torch.empty(3 * T * d // 2, device=dev, dtype=bf)
    copy_dst = torch.empty_like(copy_src)
    c2 = torch.empty(T * d, device=dev, dtype=bf)
    c2d = torch.empty_like(c2)
    print(f"copy 160 MB {timer(lambda: copy_dst.copy_(copy_src), reps=20) * 1e3:.1f} us; copy 107 MB {timer(lambda: c2d.copy_(c2), reps=20) * 1e3:.1f} us", flush=True)

    print("\nforward (us)      nm_old   nm_new  rms_old  rms_new", flush=True)
    for cfg in [(1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (4, 16), (1, 2)]:
        vals = []
        for mk in (fwd_old, fwd_new, rms_old, rms_new):
            try:
                vals.append(f"{timer(mk(cfg), reps=20) * 1e3:8.1f}")
            except Exception as e:
                vals.append(f"{'err':>8}")
                print(cfg, mk.__name__, type(e).__name__, str(e)[:200])
        print(f"{str(cfg):16} " + " ".join(vals), flush=True)
    print("shipped fwd candidates:", row_configs(d))

    print("\nbackward (us)     old_sums old_nosums new_sums new_nocap new_noseg new_nosums", flush=True)
    for cfg in [(1, 4, 2), (1, 4, 4), (1, 8, 1), (1, 8, 2), (1, 16, 1), (1, 16, 2), (1, 32, 1)]:
        vals = []
        for mk in (lambda: bwd_old(cfg, True), lambda: bwd_old(cfg, False), lambda: bwd_new(cfg, True),
                   lambda: bwd_new(cfg, True, cap=False), lambda: bwd_new(cfg, True, seg=False), lambda: bwd_new(cfg, False)):
            try:
                vals.append(f"{timer(mk(), reps=20) * 1e3:9.1f}")
            except Exception as e:
                vals.append(f"{'err':>9}")
                print(cfg, type(e).__name__, str(e)[:200])
        print(f"{str(cfg):16} " + " ".join(vals), flush=True)
    print("\nfork backward (us) old_sums new_sums new_nocap old_nosums new_nosums", flush=True)
    for cfg in [(1, 4, 2), (1, 4, 4), (1, 8, 2), (1, 16, 2)]:
        vals = []
        for mk in (lambda: bwd_old(cfg, True, res=True), lambda: bwd_new(cfg, True, res=True),
                   lambda: bwd_new(cfg, True, cap=False, res=True), lambda: bwd_old(cfg, False, res=True),
                   lambda: bwd_new(cfg, False, res=True)):
            try:
                vals.append(f"{timer(mk(), reps=20) * 1e3:9.1f}")
            except Exception as e:
                vals.append(f"{'err':>9}")
                print(cfg, type(e).__name__, str(e)[:200])
        print(f"{str(cfg):16} " + " ".join(vals), flush=True)
    print("shipped bwd candidates:", backward_configs(triton.next_power_of_2(d)))
    p, first, last, acc = ss.buffers(264, B, 2, d, dev)
    print(f"finish alone (264 programs): {timer(lambda: ss.finish(p, first, last, acc, bf), reps=20) * 1e3:.1f} us; zeros: {timer(lambda: torch.zeros(B, 2, d, device=dev), reps=20) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
