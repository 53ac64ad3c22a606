"""lora_linear as addmm.py, with the rank-r products (x down^T, gy up, and the two weight gradients) in
Triton kernels that fill the GPU where cuBLAS's 32-wide tiles do not (lowrank.py); the big GEMMs stay cuBLAS."""

from functools import partial

from .addmm import lora_linear as _lora_linear
from .lowrank import supports as supports  # Triton must import, and run on this arch

lora_linear = partial(_lora_linear, lowrank=True)
