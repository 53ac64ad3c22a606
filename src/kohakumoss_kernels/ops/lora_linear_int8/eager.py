"""The reference: ../lora_linear/eager.py over the int8 (un-rotated) weight dequantized to x's dtype."""

from ..lora_linear.eager import lora_linear_dequantized as lora_linear_int8

__all__ = ["lora_linear_int8"]
