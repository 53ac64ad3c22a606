"""lora_linear with the LoRA term written first and the frozen GEMM accumulating onto it (see addmm.py)."""

from functools import partial

from .addmm import lora_linear as _lora_linear

lora_linear = partial(_lora_linear, lora_first=True)
