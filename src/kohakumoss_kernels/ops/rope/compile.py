"""apply_rope under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import apply_rope as _eager

apply_rope = compiled(_eager)
