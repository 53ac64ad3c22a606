"""../lora_group/addmm_lowrank.py over int8 weights."""

from ..lora_group.addmm_lowrank import lora_group as lora_group_int8  # noqa: F401
from ..lora_group.addmm_lowrank import supports as supports  # noqa: F401
