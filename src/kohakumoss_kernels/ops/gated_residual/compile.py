"""gated_residual under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import gated_residual as _eager

gated_residual = compiled(_eager)
