"""../lora_linear/addmm.py: the frozen product an int8 GEMM (or per-call dequantized), the LoRA's cuBLAS."""

from ..lora_linear.addmm import lora_linear as lora_linear_int8  # noqa: F401 -- takes an Int8Weight as is
