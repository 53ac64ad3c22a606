"""qk_norm_rope under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import qk_norm_rope as _eager

qk_norm_rope = compiled(_eager)
