"""situ_glu under torch.compile: the eager reference, compiled on first call."""

from ...compile_utils import compiled
from ...compile_utils import supports as supports
from .eager import situ_glu as _eager

situ_glu = compiled(_eager)
