"""The reference: ../lora_group/eager.py over the fp8 weights dequantized to x's dtype."""

from ..lora_group.eager import lora_group_dequantized as lora_group_fp8

__all__ = ["lora_group_fp8"]
