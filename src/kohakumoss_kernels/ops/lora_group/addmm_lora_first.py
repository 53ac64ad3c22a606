"""lora_group with each member's LoRA term written first and its frozen GEMM accumulating onto it
(as ../lora_linear/addmm_lora_first.py): the tuner picks the order per shape."""

from functools import partial

from .addmm import lora_group as _lora_group

lora_group = partial(_lora_group, lora_first=True)
