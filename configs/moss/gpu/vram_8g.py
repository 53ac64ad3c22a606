"""GPU layer: cards with 8 GB of memory.

Planned memory profile: 'stream' (the DiT streamed block by block from host memory, activations offloaded).
The memory profiles are NOT built yet (a later issue): today's trainer keeps the DiT resident with
no activation checkpointing, so `kohakumoss-config check` reports the estimated peak of today's
code, which exceeds this card for the 5B model. Values are starting points, not
measured on this card size.
"""

_metadata = {"gpu_layer": "vram_8g", "card_gb": 8, "memory_profile": "stream"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 4352  # 1 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 16  # adapter rank (an algo layer may override it)
ALPHA = 16.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 4  # micro-steps per optimizer step
TEXT_ENCODE = "cache"  # must hit the offline cache: run scripts/data/cache_*.py first
