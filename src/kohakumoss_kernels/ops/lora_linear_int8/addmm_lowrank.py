"""../lora_linear/addmm_lowrank.py over an int8 weight: the rank-r products in one-launch Triton kernels."""

from ..lora_linear.addmm_lowrank import lora_linear as lora_linear_int8  # noqa: F401
from ..lora_linear.addmm_lowrank import supports as supports  # noqa: F401
