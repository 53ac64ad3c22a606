"""lora_swiglu unfused: lora_linear's addmm_lora_first (the LoRA term written first, the frozen GEMM
accumulating onto it), then SwiGLU: what the MLP ran before this op, a candidate the tuner times."""

from functools import partial

from .unfused import lora_then_swiglu

lora_swiglu = partial(lora_then_swiglu, lora_first=True)
