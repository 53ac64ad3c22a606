"""Cache hints for the row kernels' streamed tensors, each element read or written once per pass:
loads evicted first and streaming stores, so L2 keeps what is read again (per-sample parameters, cos /
sin, weights, partial sums). On the H200 (session 11) qk_norm_rope's forward went 33.4 -> 30.7 us at
16 rows x 4 warps and 35.2 -> 30.4 at 32 x 4 with both hints (docs/performance/kernels.md)."""

from __future__ import annotations

import triton.language as tl

LOAD: tl.constexpr = tl.constexpr("evict_first")  # tl.load(..., eviction_policy=LOAD)
STORE: tl.constexpr = tl.constexpr(".cs")  # tl.store(..., cache_modifier=STORE)
