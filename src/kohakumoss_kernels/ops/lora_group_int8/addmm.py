"""../lora_group/addmm.py over int8 weights: each member's frozen product as in lora_linear_int8, one
rotation of the summed input gradient."""

from ..lora_group.addmm import lora_group as lora_group_int8  # noqa: F401
