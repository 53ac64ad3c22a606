"""lora_group as addmm.py with the LoRA term written first, the rank-r products in one-launch Triton
kernels (../lora_linear/lowrank.py)."""

from functools import partial

from ..lora_linear.lowrank import supports as supports  # Triton must import and run here
from .addmm import lora_group as _lora_group

lora_group = partial(_lora_group, lowrank=True, lora_first=True)
