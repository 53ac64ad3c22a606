"""Per-op kernels for KohakuMoss: eager references, Triton / TileLang / torch.compile backends, a registry.

The model calls ops only through `registry.OpSet`, so the eager op stays the single reference.
Imports only `kohakumoss_common`.
"""

from .registry import OpSet, available_ops, resolve

__all__ = ["OpSet", "available_ops", "resolve"]
