"""Memory: a first, simple peak estimate for `kohakumoss-config check` (the memory plan comes later)."""

from .estimate import MemoryEstimate, estimate_peak, file_bytes

__all__ = ["MemoryEstimate", "estimate_peak", "file_bytes"]
