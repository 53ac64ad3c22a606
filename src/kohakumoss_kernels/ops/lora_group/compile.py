"""lora_group under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import lora_group as _eager

lora_group = compiled(_eager)
