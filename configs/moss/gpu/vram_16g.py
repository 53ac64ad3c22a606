"""GPU layer: cards with 16 GB of memory.

MEMORY_PROFILE 'auto' picks, when the run starts, the fastest entry of the memory catalog whose
predicted peak fits the card present (`kohakumoss-config profiles --gpu-mem 16` lists them).
For an adapter with these knobs the named profile that fits is 'balanced':
(the DiT resident, every block checkpointed);
set MEMORY_PROFILE = 'balanced' to pin it. docs/concepts/profiles.md says what each does.
Values are starting points, not measured on this card size.
"""

_metadata = {"gpu_layer": "vram_16g", "card_gb": 16, "memory_profile": "balanced"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 4352  # 1 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 32  # adapter rank (an algo layer may override it)
ALPHA = 32.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 2  # micro-steps per optimizer step
MEMORY_PROFILE = "auto"  # fastest catalog entry that fits the card (CARD_GB 0: the GPU present)
