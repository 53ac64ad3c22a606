"""lora_swiglu under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import lora_swiglu as _eager

lora_swiglu = compiled(_eager)
