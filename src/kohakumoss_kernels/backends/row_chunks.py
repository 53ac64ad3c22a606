"""A row of width d held as C <= 3 chunks of W columns (W a power of two) instead of one power-of-two tile.

d = 3072 is 3 x 1024: one 4096-wide tile would leave a quarter of every thread's registers, loads and
arithmetic masked off. The kernels that use this unroll the chunks by hand (`if C > 1`), Triton having
no lists of tensors; a chunk that does not exist (C < 3) is the first one again and never used.
H200, norm_modulate at d = 3072, against one padded tile (2026-11-30):
forward 32.3 -> 31.2 us, backward 52.8 -> 50.2, its fork's backward 62.6 -> 59.4 (best launch configs).
"""

from __future__ import annotations

import triton
import triton.language as tl

MAX_CHUNKS = 3


def row_chunks(d: int) -> tuple[int, int]:
    """(W, C): the chunk width and count covering d with the fewest masked columns, then the fewest chunks."""
    options = []
    for c in range(1, MAX_CHUNKS + 1):
        w = triton.next_power_of_2(max(1, triton.cdiv(d, c)))
        options.append((c * w - d, c, w))
    _, c, w = min(options)
    return w, c


def width(d: int) -> dict[str, int]:
    """row_chunks(d) as a kernel's constexprs: `width=` of triton_utils.row_launch and PerSampleBackward."""
    w, c = row_chunks(d)
    return {"W": w, "C": c}


@triton.jit
def masks(rmask, d, W: tl.constexpr, C: tl.constexpr):
    """Each chunk's mask of a [rows, W] tile: rows in `rmask` ([rows, 1], or a scalar for one row) and
    columns below d."""
    cols = tl.arange(0, W)[None, :]
    m0 = rmask & (cols < d)
    m1 = m0
    m2 = m0
    if C > 1:
        m1 = rmask & (cols + W < d)
    if C > 2:
        m2 = rmask & (cols + 2 * W < d)
    return m0, m1, m2


@triton.jit
def load(ptr, loc, m0, m1, m2, W: tl.constexpr, C: tl.constexpr):
    """The chunks at ptr + loc (loc: the first chunk's offsets), in the tensor's dtype."""
    a = tl.load(ptr + loc, mask=m0, other=0.0)
    b = a
    c = a
    if C > 1:
        b = tl.load(ptr + loc + W, mask=m1, other=0.0)
    if C > 2:
        c = tl.load(ptr + loc + 2 * W, mask=m2, other=0.0)
    return a, b, c


@triton.jit
def store(ptr, loc, a, b, c, m0, m1, m2, W: tl.constexpr, C: tl.constexpr):
    ty = ptr.dtype.element_ty
    tl.store(ptr + loc, a.to(ty), mask=m0)
    if C > 1:
        tl.store(ptr + loc + W, b.to(ty), mask=m1)
    if C > 2:
        tl.store(ptr + loc + 2 * W, c.to(ty), mask=m2)


@triton.jit
def row_sum(a, b, c, C: tl.constexpr):
    """Sum over each row's columns (axis 1) across the chunks."""
    total = tl.sum(a, axis=1)
    if C > 1:
        total += tl.sum(b, axis=1)
    if C > 2:
        total += tl.sum(c, axis=1)
    return total
