"""../lora_linear/addmm.py: the frozen products as fp8 GEMMs (or per-call dequantized), the LoRA's cuBLAS."""

from ..lora_linear.addmm import lora_linear as lora_linear_fp8  # noqa: F401 -- takes an Fp8Weight as is
