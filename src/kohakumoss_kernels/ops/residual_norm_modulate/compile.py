"""residual_norm_modulate under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import residual_norm_modulate as _eager

residual_norm_modulate = compiled(_eager)
