"""Scratch kernels (session 11, not committed)."""
import sys

import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels import sample_sums as ss  # noqa: E402


@triton.jit
def _load_tile(X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES: tl.constexpr):
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + row * d + loc, mask=mask, other=0.0)
    dy = tl.load(DY + row * d + loc, mask=mask, other=0.0)
    if HAS_RES:
        dres = tl.load(DRES + row * d + loc, mask=mask, other=0.0)
    else:
        dres = x
    rstd = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    s = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
    return mask, x, dy, dres, rstd, s


@triton.jit
def flush_v(acc, P, D, pid, k, K: tl.constexpr, cur, seg, d, cols, cmask, opaque):
    total = tl.sum(acc, axis=0)
    if seg == 0:
        base = tl.where(opaque >= 0, ((pid.to(tl.int64) * 2) * K + k) * d, 0)
        tl.store(P + base + cols, total, mask=cmask)
    else:
        tl.atomic_add(D + (cur * K + k) * d + cols, total, mask=cmask)


@triton.jit
def _nm_bwd_exp(
    DY, X, SCALE, TS, RSTD, DX, DRES, HAS_RES: tl.constexpr, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr, SEG: tl.constexpr, MODE: tl.constexpr = 0,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    rid = tl.arange(0, ROWS)
    loc = rid[:, None] * d + cols[None, :]
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, ROWS)
    cur = first
    seg = pid * 0
    acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    row = start
    mask, x_next, dy_next, dres_next, rstd_next, s_next = _load_tile(
        X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES
    )
    for _ in range(0, n):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        dres = dres_next
        rstd = rstd_next[:, None]
        s = s_next
        if MODE == 12:  # ROWS == 1: a new sample's row flushes the sums first, before this tile's math
            si = tl.max(s, axis=0)
            if (si != cur) & (si >= 0):
                ss.flush(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask)
                ss.flush(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask)
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
        cur_row, cur_mask = row, mask
        row += ROWS
        mask, x_next, dy_next, dres_next, rstd_next, s_next = _load_tile(
            X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES
        )
        s1 = tl.load(TS + cur_row, mask=cur_row < end, other=-1).to(tl.int64)  # ROWS == 1: a scalar
        if MODE == 11:
            sc = tl.load(SCALE + tl.maximum(s1, 0).to(tl.int32) * d + loc, mask=cur_mask, other=0.0).to(tl.float32)
        elif GATHER:
            poff = tl.maximum(s, 0).to(tl.int32)[:, None] * d + cols[None, :]
            sc = tl.load(SCALE + poff, mask=cur_mask, other=0.0).to(tl.float32)
        else:
            sc = tl.full([ROWS, BLOCK], 0.5, tl.float32)
        xhat = x * rstd
        g = dy * (1.0 + sc)
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=1) / d)[:, None])
        if HAS_RES:
            dx += dres.to(tl.float32)
        tl.store(DX + cur_row * d + loc, dx.to(DX.dtype.element_ty), mask=cur_mask)
        c_sc = dy * xhat
        if MODE == 12:
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 1:  # ROWS == 1: one row, the boundary a scalar test
            si = tl.sum(s, axis=0)
            if (si != cur) & (si >= 0):
                ss.flush(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask)
                ss.flush(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask)
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 2:  # as 1, store only (no atomics; wrong past two segments: registers only)
            si = tl.sum(s, axis=0)
            if (si != cur) & (si >= 0):
                tl.store(P + ((pid.to(tl.int64) * 2) * 2 + 0) * d + cols, tl.sum(acc_sc, axis=0), mask=cmask)
                tl.store(P + ((pid.to(tl.int64) * 2) * 2 + 1) * d + cols, tl.sum(acc_sh, axis=0), mask=cmask)
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 3:  # as 1, the accumulators' flush without a reduction (ROWS == 1: [1, BLOCK] stored)
            si = tl.sum(s, axis=0)
            if (si != cur) & (si >= 0):
                tl.store(P + ((pid.to(tl.int64) * 2) * 2 + 0) * d + cols[None, :], acc_sc, mask=cmask[None, :])
                tl.store(P + ((pid.to(tl.int64) * 2) * 2 + 1) * d + cols[None, :], acc_sh, mask=cmask[None, :])
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 4:  # ROWS == 1: the flush a branch with stores only; the sums reset arithmetically
            si = tl.max(s, axis=0)
            boundary = (si != cur) & (si >= 0)
            if boundary:
                ss.flush(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask)
                ss.flush(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask)
            keep = tl.where(boundary, 0.0, 1.0)
            acc_sc = acc_sc * keep + c_sc
            acc_sh = acc_sh * keep + dy
            seg = tl.where(boundary, seg + 1, seg)
            cur = tl.where(boundary, si, cur)
        elif MODE == 5:  # as 1, the slot address behind a loop-variant select (not hoisted)
            si = tl.max(s, axis=0)
            if (si != cur) & (si >= 0):
                flush_v(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask, cur_row)
                flush_v(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask, cur_row)
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 6:  # as 1, no flush at all (registers only: what the branch's stores cost)
            si = tl.max(s, axis=0)
            if (si != cur) & (si >= 0):
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 7:  # arithmetic reset only (registers only)
            si = tl.max(s, axis=0)
            boundary = (si != cur) & (si >= 0)
            keep = tl.where(boundary, 0.0, 1.0)
            acc_sc = acc_sc * keep + c_sc
            acc_sh = acc_sh * keep + dy
            seg = tl.where(boundary, seg + 1, seg)
            cur = tl.where(boundary, si, cur)
        elif MODE == 8:  # ROWS == 1, branch-free: predicated 2D stores / atomics every tile, arithmetic reset
            si = tl.max(s, axis=0)
            boundary = (si != cur) & (si >= 0)
            m0 = cmask[None, :] & boundary & (seg == 0)
            m1 = cmask[None, :] & boundary & (seg > 0)
            slot = P + ((pid.to(tl.int64) * 2) * 2) * d + cols[None, :]
            tl.store(slot, acc_sc, mask=m0)
            tl.store(slot + d, acc_sh, mask=m0)
            dsum = D + (cur * 2) * d + cols[None, :]
            tl.atomic_add(dsum, acc_sc, mask=m1)
            tl.atomic_add(dsum + d, acc_sh, mask=m1)
            keep = tl.where(boundary, 0.0, 1.0)
            acc_sc = acc_sc * keep + c_sc
            acc_sh = acc_sh * keep + dy
            seg = tl.where(boundary, seg + 1, seg)
            cur = tl.where(boundary, si, cur)
        elif MODE == 9:  # noseg sums + the sample test carried (cur), not used in the sums
            si = tl.max(s, axis=0)
            boundary = (si != cur) & (si >= 0)
            cur = tl.where(boundary, si, cur)
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 10:  # noseg sums scaled by a loop-variant scalar from rstd (not s)
            keep = tl.where(tl.max(rstd_next, axis=0) > 0, 1.0, 0.0)
            acc_sc = acc_sc * keep + c_sc
            acc_sh = acc_sh * keep + dy
        elif MODE == 11:  # ROWS == 1: the row's sample a scalar load (no reduction over the tile's rows)
            if (s1 != cur) & (s1 >= 0):
                ss.flush(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask)
                ss.flush(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask)
                acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                seg += 1
                cur = s1
            acc_sc += c_sc
            acc_sh += dy
        elif MODE == 14 or MODE == 15:  # as 6 (reset only, no flush), zeros made another way
            si = tl.max(s, axis=0)
            if (si != cur) & (si >= 0):
                if MODE == 14:
                    acc_sc = tl.zeros_like(acc_sc)
                    acc_sh = tl.zeros_like(acc_sh)
                else:
                    acc_sc = acc_sc * 0.0
                    acc_sh = acc_sh * 0.0
                seg += 1
                cur = si
            acc_sc += c_sc
            acc_sh += dy
        elif SEG:
            acc_sc, acc_sh, unused, cur, seg = ss.add_tile(
                acc_sc, acc_sh, acc_sh, c_sc, dy, dy, s, cur, seg, rid, P, D, pid, d, cols, cmask, 2, ROWS, BLOCK,
                NEED_SUMS,
            )  # fmt: skip
        elif NEED_SUMS:  # plain sums, no segment logic (wrong across samples: timing only)
            acc_sc += c_sc
            acc_sh += dy
    ss.close_chunk(acc_sc, acc_sh, acc_sh, P, FIRST, LAST, pid, n, first, cur, seg, d, cols, cmask, 2, NEED_SUMS)




@triton.jit
def segment_end(TS, row, end, sample, SCAN: tl.constexpr = 64):
    found = end
    at = row
    while at < found:
        idx = at + tl.arange(0, SCAN)
        v = tl.load(TS + idx, mask=idx < end, other=sample)
        found = tl.minimum(found, tl.min(tl.where(v != sample, idx, end), axis=0))
        at += SCAN
    return found


@triton.jit
def emit(acc, P, D, pid, k, K: tl.constexpr, cur, seg, last, d, cols, cmask):
    total = tl.sum(acc, axis=0)
    if seg == 0:
        tl.store(P + ((pid.to(tl.int64) * 2) * K + k) * d + cols, total, mask=cmask)
    elif last:
        tl.store(P + ((pid.to(tl.int64) * 2 + 1) * K + k) * d + cols, total, mask=cmask)
    else:
        tl.atomic_add(D + (cur * K + k) * d + cols, total, mask=cmask)


@triton.jit
def _load_tile2(X, DY, DRES, RSTD, row, end, rid, loc, cmask, d, HAS_RES: tl.constexpr):
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + row * d + loc, mask=mask, other=0.0)
    dy = tl.load(DY + row * d + loc, mask=mask, other=0.0)
    if HAS_RES:
        dres = tl.load(DRES + row * d + loc, mask=mask, other=0.0)
    else:
        dres = x
    rstd = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    return mask, x, dy, dres, rstd


@triton.jit
def _nm_bwd_seg(
    DY, X, SCALE, TS, RSTD, DX, DRES, HAS_RES: tl.constexpr, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, HOLD: tl.constexpr, EMIT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    rid = tl.arange(0, ROWS)
    loc = rid[:, None] * d + cols[None, :]
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, ROWS)
    cur = first
    seg = pid * 0 - 1
    row = start
    while row < end:
        seg += 1
        seg_end = segment_end(TS, row, end, cur)
        acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        mask, x_next, dy_next, dres_next, rstd_next = _load_tile2(
            X, DY, DRES, RSTD, row, seg_end, rid, loc, cmask, d, HAS_RES
        )
        if HOLD:
            sc_row = tl.load(SCALE + cur.to(tl.int32) * d + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        for _ in range(0, tl.cdiv(seg_end - row, ROWS)):
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            dres = dres_next
            rstd = rstd_next[:, None]
            cur_row, cur_mask = row, mask
            row += ROWS
            mask, x_next, dy_next, dres_next, rstd_next = _load_tile2(
                X, DY, DRES, RSTD, row, seg_end, rid, loc, cmask, d, HAS_RES
            )
            if HOLD:
                sc = sc_row
            else:
                sc = tl.load(SCALE + cur.to(tl.int32) * d + loc, mask=cur_mask, other=0.0).to(tl.float32)
            xhat = x * rstd
            g = dy * (1.0 + sc)
            dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=1) / d)[:, None])
            if HAS_RES:
                dx += dres.to(tl.float32)
            tl.store(DX + cur_row * d + loc, dx.to(DX.dtype.element_ty), mask=cur_mask)
            if NEED_SUMS:
                acc_sc += dy * xhat
                acc_sh += dy
        if NEED_SUMS:
            if EMIT:
                emit(acc_sc, P, D, pid, 0, 2, cur, seg, seg_end == end, d, cols, cmask)
                emit(acc_sh, P, D, pid, 1, 2, cur, seg, seg_end == end, d, cols, cmask)
            else:
                tl.store(P + pid * d + cols, tl.sum(acc_sc + acc_sh, axis=0), mask=cmask)
        row = seg_end
        cur = tl.load(TS + row, mask=row < end, other=cur)
    if NEED_SUMS:
        ss.mark(FIRST, LAST, pid, n, first, cur, seg)
