"""GPU layer: cards with 80 GB+ of memory.

MEMORY_PROFILE 'auto' picks, when the run starts, the fastest entry of the memory catalog whose
predicted peak fits the card present (`kohakumoss-config profiles --gpu-mem 80` lists them).
For an adapter with these knobs the named profile that fits is 'speed':
(everything resident, nothing checkpointed);
set MEMORY_PROFILE = 'speed' to pin it. docs/concepts/profiles.md says what each does.
The token budget is the one of the H200 LoRA r32 run in docs/performance/training.md (59.0 GiB
peak allocated); rank 64 and the other values were not measured.
"""

_metadata = {"gpu_layer": "vram_80g", "card_gb": 80, "memory_profile": "speed"}

PRECISION = "bf16"  # pre-Ampere cards (no bf16): set "fp16" in your own config
TOKENS_PER_STEP = 8704  # 2 x (1 MP image: 4096 image tokens + 256 caption tokens) per micro-step
RANK = 64  # adapter rank (an algo layer may override it)
ALPHA = 64.0  # scale = ALPHA / RANK = 1
GRAD_ACCUM = 1  # micro-steps per optimizer step
MEMORY_PROFILE = "auto"  # fastest catalog entry that fits the card (CARD_GB 0: the GPU present)
