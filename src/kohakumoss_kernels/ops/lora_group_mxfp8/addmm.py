"""../lora_group/addmm.py over MXFP8 weights: each member's frozen product as in lora_linear_mxfp8."""

from ..lora_group.addmm import lora_group as lora_group_mxfp8  # noqa: F401
