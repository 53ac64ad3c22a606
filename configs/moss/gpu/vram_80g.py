"""GPU layer: cards with 80 GB+ of memory.

Planned memory profile: 'resident' (everything resident, no checkpointing).
This is what today's trainer does (the other profiles are NOT built yet). The token budget is the
one of the H200 LoRA r32 run in docs/performance/training.md (59.0 GiB peak allocated); rank 64 and
the other values were not measured.
"""

_metadata = {"gpu_layer": "vram_80g", "card_gb": 80, "memory_profile": "resident"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 8704  # 2 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 64  # adapter rank (an algo layer may override it)
ALPHA = 64.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 1  # micro-steps per optimizer step
