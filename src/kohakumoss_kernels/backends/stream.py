"""Cache hints for streamed tensors (each element read or written once per pass): loads evicted first and
streaming stores. Used by the rotary kernels (qk_norm_rope, apply_rope), which read each head row as two
half rows beside per-token cos / sin: on the H200 qk_norm_rope's forward went 33.4 -> 30.7 us
at 16 rows x 4 warps and 35.2 -> 30.4 at 32 x 4 (same run). Tried on the other row kernels and taken
out: no gain standalone, and gated_residual and the MLP activation's kernel (the GLU of that time) ran
3-6 us slower per call in the training step than without them (another machine, so only indicative;
their outputs are read next from L2, which streaming stores give up)."""

from __future__ import annotations

import triton.language as tl

LOAD: tl.constexpr = tl.constexpr("evict_first")  # tl.load(..., eviction_policy=LOAD)
STORE: tl.constexpr = tl.constexpr(".cs")  # tl.store(..., cache_modifier=STORE)
