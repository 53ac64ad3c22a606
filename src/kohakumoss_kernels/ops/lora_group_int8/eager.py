"""The reference: ../lora_group/eager.py over the int8 (un-rotated) weights dequantized to x's dtype."""

from ..lora_group.eager import lora_group_dequantized as lora_group_int8

__all__ = ["lora_group_int8"]
