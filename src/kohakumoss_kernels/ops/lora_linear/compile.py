"""lora_linear under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import lora_linear as _eager

lora_linear = compiled(_eager)
