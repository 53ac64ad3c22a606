"""GPU layer: cards with 12 GB of memory.

MEMORY_PROFILE 'auto' picks, when the run starts, the fastest entry of the memory catalog whose
predicted peak fits the card present (`kohakumoss-config profiles --gpu-mem 12` lists them).
For an adapter with these knobs the named profile that fits is 'low_vram':
(every block checkpointed, 32 of 42 blocks streamed from host memory, optimizer on the host);
set MEMORY_PROFILE = 'low_vram' to pin it. docs/concepts/profiles.md says what each does.
Values are starting points, not measured on this card size.
"""

_metadata = {"gpu_layer": "vram_12g", "card_gb": 12, "memory_profile": "low_vram"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 4352  # 1 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 16  # adapter rank (an algo layer may override it)
ALPHA = 16.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 2  # micro-steps per optimizer step
TEXT_ENCODE = "cache"  # must hit the offline cache: run scripts/data/cache_*.py first
MEMORY_PROFILE = "auto"  # fastest catalog entry that fits the card (CARD_GB 0: the GPU present)
