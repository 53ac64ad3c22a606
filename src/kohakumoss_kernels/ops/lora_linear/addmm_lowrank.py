"""lora_linear as addmm_lora_first.py, with the rank-r products (x down^T, gy up, and the two weight
gradients) in one-launch Triton kernels (lowrank.py) instead of cuBLAS's split-K GEMM + reduce + memset;
the big GEMMs stay cuBLAS."""

from functools import partial

from .addmm import lora_linear as _lora_linear
from .lowrank import supports as supports  # Triton must import, and run on this arch

lora_linear = partial(_lora_linear, lora_first=True, lowrank=True)
