"""Per-op kernels for KohakuMoss: eager references, Triton / TileLang / torch.compile backends, a registry.

The ops are listed in `op_list.py` (name, arguments, reference, variants). The model calls them only
through `registry.OpSet`, so the eager op stays the single reference.
Beside them: `ops/<op>/` (each op's reference and backends), `weights/` (the frozen weight kinds),
`tuning/` (the per-card tuning table), `backends/` (what the backends share) and `runtime/` (what the
code running the model opens or sets around op calls).
Imports only `kohakumoss_common`.
"""

from .op_list import OPS, OpSpec
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
    "OPS",
    "BoundOp",
    "OpSpec",
    "OpSet",
    "available_ops",
    "priority_for",
    "register_backend",
    "register_op",
    "resolve",
    "tuning_window",
]
