"""../lora_group/addmm.py over fp8 weights: x quantized once for every member, one fp8 GEMM for gx."""

from ..lora_group.addmm import lora_group as lora_group_fp8  # noqa: F401
