"""Per-op kernels for KohakuMoss: eager references, Triton / TileLang / torch.compile backends, a registry.

The model calls ops only through `registry.OpSet`, so the eager op stays the single reference.
Imports only `kohakumoss_common`.
"""

from .registry import (
    DEFAULT_PRIORITY,
    BoundOp,
    OpSet,
    available_ops,
    priority_for,
    register_backend,
    register_op,
    resolve,
)
from .tuning import tuning_window

__all__ = [
    "DEFAULT_PRIORITY",
    "BoundOp",
    "OpSet",
    "available_ops",
    "priority_for",
    "register_backend",
    "register_op",
    "resolve",
    "tuning_window",
]
