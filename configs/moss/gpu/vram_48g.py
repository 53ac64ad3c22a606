"""GPU layer: cards with 48 GB of memory.

Planned memory profile: 'balanced' (the DiT resident in bf16, activation checkpointing).
The memory profiles are NOT built yet (a later issue): today's trainer keeps the DiT resident with
no activation checkpointing, so `kohakumoss-config check` reports the estimated peak of today's
code, which exceeds this card for the 5B model. Values are starting points, not
measured on this card size.
"""

_metadata = {"gpu_layer": "vram_48g", "card_gb": 48, "memory_profile": "balanced"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 8704  # 2 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 64  # adapter rank (an algo layer may override it)
ALPHA = 64.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 1  # micro-steps per optimizer step
