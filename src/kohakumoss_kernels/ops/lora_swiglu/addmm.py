"""lora_swiglu unfused: lora_linear's addmm (the LoRA term added onto the frozen GEMM's output in place),
then SwiGLU; runs wherever torch does (the CPU included)."""

from functools import partial

from .unfused import lora_then_swiglu

lora_swiglu = partial(lora_then_swiglu, lora_first=False)
