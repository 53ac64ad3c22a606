"""../lora_linear/addmm.py: the frozen product block-scaled (sm100+) or dequantized, the LoRA's cuBLAS."""

from ..lora_linear.addmm import lora_linear as lora_linear_mxfp8  # noqa: F401 -- takes an Mxfp8Weight as is
