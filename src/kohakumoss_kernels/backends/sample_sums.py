"""Parameter gradients from per-program partial sums, without atomics on hot rows.

`sum_rows` adds the partial rows [programs, d] of a weight gradient (RMSNorm, QK-norm) in one launch
that also casts to the weight's dtype.

Per-sample parameters (AdaLN shift / scale / gate):

A backward program walks a contiguous chunk of rows. It sums each parameter's gradient in registers
while consecutive rows belong to the same sample (a "segment"). The chunk's first segment goes to
partial slot 0 of the program and its last to slot 1 (`P [programs, 2, K, d]`, with the samples in
`FIRST` / `LAST [programs]`, -1 where unused); a segment between them is a whole sample in the
packed layout and goes to the output directly (an atomic add that meets no other program; only for
rows not grouped by sample can two programs meet there). `finish` then adds, per (sample, parameter,
column block), the partial slots whose sample matches: a small second pass over `P`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .triton_utils import backward_configs, next_pow2, persistent_programs, register_budget

# The second passes over the partials are latency-bound (a few MB, a loop over the programs' rows). The
# per-sample finish: many narrow column blocks and few, wide row steps (16-32 rows x
# 128-256 columns took ~14 us per finish for 13 MB of partials on the H200; 64 x 64 now). sum_rows: all
# rows in one tile (sum_rows_blocks): rms_norm's 264 partials of 3072 5.4 -> 3.3 us,
# qk_norm_rope's 528 of 128 (two programs of 64 x 64) 8.1 -> 2.8 us; the same tiles made the per-sample
# finish slower (K = 2: 5.5 -> 7.3 us; each program also reloads FIRST / LAST), so it keeps 64 x 64.
FINISH_ROWS, FINISH_COLS = 64, 64
SUM_MAX_ROWS, SUM_TILE, SUM_MIN_COLS, SUM_WARPS = 1024, 8192, 8, 8


@triton.jit
def flush(acc, P, D, pid, k, K: tl.constexpr, cur, seg, d, cols, cmask):
    """End of a segment of sample `cur`: the chunk's first segment to slot 0, later ones to D[cur, k]."""
    total = tl.sum(acc, axis=0)
    if seg == 0:
        tl.store(P + ((pid.to(tl.int64) * 2) * K + k) * d + cols, total, mask=cmask)
    else:
        tl.atomic_add(D + (cur * K + k) * d + cols, total, mask=cmask)


@triton.jit
def close(acc, P, pid, k, K: tl.constexpr, seg, d, cols, cmask):
    """End of the chunk: the open segment to slot 0 (the chunk had one segment) or slot 1."""
    slot = tl.where(seg == 0, 0, 1).to(tl.int64)
    tl.store(P + ((pid.to(tl.int64) * 2 + slot) * K + k) * d + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def mark(FIRST, LAST, pid, n, first, cur, seg):
    """Which samples the program's partial slots hold (-1: none)."""
    tl.store(FIRST + pid, tl.where(n > 0, first, -1))
    tl.store(LAST + pid, tl.where((n > 0) & (seg > 0), cur, -1))


@triton.jit
def chunk(TS, pid, tiles_per_prog, T, ROWS: tl.constexpr):
    """A persistent backward program's rows [start, end), its tile count, and the sample of its first row."""
    start = pid.to(tl.int64) * tiles_per_prog * ROWS
    end = tl.minimum(start + tiles_per_prog * ROWS, T)
    n = tl.cdiv(end - start, ROWS)
    first = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    return start, end, n, first


@triton.jit
def add_tile(
    a0, a1, a2, c0, c1, c2, s, cur, seg, rid, P, D, pid, d, cols, cmask,
    K: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, NEED: tl.constexpr,
):  # fmt: skip
    """Add a tile's per-row contributions c0..c{K-1} (K of 1..3; the rest are ignored) to the running
    sums a0..a{K-1} of sample `cur`, flushing the sums where a row of another sample starts; rows with
    s == -1 are past the chunk. Returns the sums, the current sample and segment. NEED False (the
    parameters need no gradient): nothing is summed, and the kernel's contributions are left unused."""
    if NEED:
        if tl.sum(((s != cur) & (s >= 0)).to(tl.int32), axis=0) == 0:
            a0 += c0
            if K > 1:
                a1 += c1
            if K > 2:
                a2 += c2
        else:  # a sample boundary inside this tile: row by row
            for i in tl.static_range(ROWS):
                sel = rid == i
                si = tl.sum(tl.where(sel, s, 0), axis=0)
                if (si != cur) & (si >= 0):
                    flush(a0, P, D, pid, 0, K, cur, seg, d, cols, cmask)
                    if K > 1:
                        flush(a1, P, D, pid, 1, K, cur, seg, d, cols, cmask)
                    if K > 2:
                        flush(a2, P, D, pid, 2, K, cur, seg, d, cols, cmask)
                    a0 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    if K > 1:
                        a1 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    if K > 2:
                        a2 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    seg += 1
                    cur = si
                a0 += tl.where(sel[:, None], c0, 0.0)
                if K > 1:
                    a1 += tl.where(sel[:, None], c1, 0.0)
                if K > 2:
                    a2 += tl.where(sel[:, None], c2, 0.0)
    return a0, a1, a2, cur, seg


@triton.jit
def close_chunk(
    a0, a1, a2, P, FIRST, LAST, pid, n, first, cur, seg, d, cols, cmask, K: tl.constexpr, NEED: tl.constexpr
):
    """End of the chunk: the open sums a0..a{K-1} to their slots, and which samples the slots hold
    (nothing where NEED is False)."""
    if NEED:
        close(a0, P, pid, 0, K, seg, d, cols, cmask)
        if K > 1:
            close(a1, P, pid, 1, K, seg, d, cols, cmask)
        if K > 2:
            close(a2, P, pid, 2, K, seg, d, cols, cmask)
        mark(FIRST, LAST, pid, n, first, cur, seg)


@triton.jit
def _per_program_sum_rows(
    P, OUT, G, d, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False
):
    pdl.wait_inputs(PDL)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        acc += tl.load(
            P + g.to(tl.int64)[:, None] * d + cols[None, :], mask=(g < G)[:, None] & cmask[None, :]
        )
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=cmask)


def sum_rows_blocks(programs: int, d: int) -> tuple[int, int]:
    """(BLOCK_G, BLOCK_C) of sum_rows over `programs` partial rows of width d: all rows (up to
    SUM_MAX_ROWS) in one tile of SUM_TILE elements, so each program issues its loads at once instead of
    a chain of dependent steps, and narrow column blocks for many programs."""
    block_g = min(triton.next_power_of_2(max(programs, 1)), SUM_MAX_ROWS)
    block_c = max(SUM_MIN_COLS, min(triton.next_power_of_2(d), SUM_TILE // block_g))
    return block_g, block_c


def sum_rows(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """p [programs, d] fp32 -> its column sums [d] in `dtype`."""
    g, d = p.shape
    out = torch.empty(d, device=p.device, dtype=dtype)
    block_g, block_c = sum_rows_blocks(g, d)
    _per_program_sum_rows[(triton.cdiv(d, block_c),)](
        p, out, g, d, BLOCK_G=block_g, BLOCK_C=block_c, num_warps=SUM_WARPS, **pdl.options(p)
    )
    return out


@triton.jit
def _per_sample_finish(
    P, FIRST, LAST, D, OUT, G, d, K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    s = tl.program_id(0)
    k = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gmask = g < G
        f = tl.load(FIRST + g, mask=gmask, other=-1)
        la = tl.load(LAST + g, mask=gmask, other=-1)
        base = (g.to(tl.int64)[:, None] * 2 * K + k) * d + cols[None, :]
        acc += tl.load(P + base, mask=(f == s)[:, None] & cmask[None, :], other=0.0)
        acc += tl.load(P + base + K * d, mask=(la == s)[:, None] & cmask[None, :], other=0.0)
    at = (s.to(tl.int64) * K + k) * d + cols
    total = tl.load(D + at, mask=cmask, other=0.0) + tl.sum(acc, axis=0)
    tl.store(OUT + at, total.to(OUT.dtype.element_ty), mask=cmask)


@triton.jit
def zero_acc(ACC, n, BLOCK: tl.constexpr):
    """Zero the backward's atomics target ACC [n] fp32 from the forward's programs (grid-strided; n = 0:
    nothing), so the backward launches no memset of its own (1.6-1.8 us per call on the H200)."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(ACC + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


def forward_acc(needed: bool, samples: int, k: int, like: torch.Tensor) -> tuple[torch.Tensor | None, tuple]:
    """The backward's atomics target D [samples, k, d] fp32 for `like` [T, d], left for the forward kernel
    to zero, and that kernel's (ACC, n) arguments: (like, 0) where no parameter needs a gradient or T is 0
    (no kernel runs)."""
    if not needed or like.shape[0] == 0:
        return None, (like, 0)
    acc = torch.empty(samples, k, like.shape[1], device=like.device, dtype=torch.float32)
    return acc, (acc, acc.numel())


def take(ctx) -> torch.Tensor | None:
    """The forward's zeroed D (`ctx.acc`) for this backward, once: a second backward through a retained
    graph finds None and zeroes its own."""
    acc, ctx.acc = getattr(ctx, "acc", None), None
    return acc


def buffers(
    programs: int, samples: int, k: int, d: int, device, acc: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    """(P, FIRST, LAST, D): partial slots, their samples, and the fp32 output D [samples, k, d]: `acc`
    where the forward zeroed one, else zeroed here."""
    p = torch.empty(programs, 2, k, d, device=device, dtype=torch.float32)
    first = torch.empty(programs, device=device, dtype=torch.int64)
    last = torch.empty(programs, device=device, dtype=torch.int64)
    if acc is None:
        acc = torch.zeros(samples, k, d, device=device, dtype=torch.float32)
    return p, first, last, acc


def finish(
    p: torch.Tensor, first: torch.Tensor, last: torch.Tensor, acc: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """acc [samples, K, d] (the atomics' sums) plus every program's partial slots, by sample, in `dtype`."""
    samples, k, d = acc.shape
    out = torch.empty(acc.shape, device=acc.device, dtype=dtype)
    if samples and d:
        block_c = min(FINISH_COLS, triton.next_power_of_2(d))
        _per_sample_finish[(samples, k, triton.cdiv(d, block_c))](
            p,
            first,
            last,
            acc,
            out,
            p.shape[0],
            d,
            K=k,
            BLOCK_G=FINISH_ROWS,
            BLOCK_C=block_c,
            num_warps=4,
            **pdl.options(p),
        )
    return out


class PerSampleBackward:
    """launch(cfg) for `triton_utils.pick` running a persistent per-sample backward
    `kernel(*args, P, D, FIRST, LAST, T, d, tiles_per_prog, NEED_SUMS, ROWS, **width)` over `like` [T, d]
    (width: the row's constexprs, BLOCK = next_pow2(d) unless given)
    with cfg = (ROWS, num_warps, programs per SM), then the second pass over its partials (so the pick
    times both: more programs, more partials); `sums` then holds the per-sample sums [samples, K, d] in
    `dtype`. need_sums False (the parameters need no gradient: a frozen AdaLN modulation, as with LoRA
    on attention and MLP only): the kernel skips the sums, and no buffers or finish pass. `acc`: D as
    zeroed by the op's forward (`forward_acc`), used by `run` only: `pick` times calls that zero their own."""

    def __init__(
        self,
        kernel,
        args: tuple,
        like: torch.Tensor,
        samples: int,
        k: int,
        need_sums: bool,
        dtype: torch.dtype,
        width: dict | None = None,
        acc: torch.Tensor | None = None,
    ):
        self.kernel, self.args, self.like, self.samples, self.k = kernel, args, like, samples, k
        self.acc = acc
        self.need_sums, self.dtype = need_sums, dtype
        self.width = {"BLOCK": next_pow2(like.shape[1])} if width is None else width
        self.sums: torch.Tensor | None = None

    def configs(self) -> list[tuple[int, int, int]]:
        return backward_configs(next_pow2(self.like.shape[1]))

    def __call__(self, cfg: tuple) -> None:
        self._launch(cfg, None)

    def run(self, cfg: tuple) -> None:
        """The op's own launch, into the forward's zeroed `acc` where given."""
        self._launch(cfg, self.acc)

    def _launch(self, cfg: tuple, acc: torch.Tensor | None) -> None:
        rows, warps, per_sm = cfg
        T, d = self.like.shape
        tiles = triton.cdiv(T, rows)
        grid = persistent_programs(self.like, tiles, per_sm)
        if self.need_sums:
            p, first, last, acc = buffers(grid, self.samples, self.k, d, self.like.device, acc)
        else:  # never read or written by the kernel
            p = first = last = acc = self.like
        self.kernel[(grid,)](
            *self.args,
            p,
            acc,
            first,
            last,
            T,
            d,
            triton.cdiv(tiles, grid),
            NEED_SUMS=self.need_sums,
            ROWS=rows,
            **self.width,
            num_warps=warps,
            **register_budget(self.like, warps, per_sm),
            **pdl.options(self.like),
        )
        self.sums = finish(p, first, last, acc, self.dtype) if self.need_sums else None
