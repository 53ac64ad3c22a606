"""varlen_attention_rope under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import varlen_attention_rope as _eager

varlen_attention_rope = compiled(_eager)
