"""rms_norm under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import rms_norm as _eager

rms_norm = compiled(_eager)
