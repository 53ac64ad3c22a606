"""norm_modulate under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import norm_modulate as _eager

norm_modulate = compiled(_eager)
