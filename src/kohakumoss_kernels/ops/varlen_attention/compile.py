"""varlen_attention under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import varlen_attention as _eager

varlen_attention = compiled(_eager)
