"""What every TileLang backend shares: the import probe and which (arch, dtype) it is built for."""

from __future__ import annotations

import torch


def supports(arch: str, dtype: torch.dtype) -> bool:
    """TileLang builds for sm70/sm75 (Volta/Turing MMA, fp16 only there) and sm80+; it runs when named."""
    import tilelang  # noqa: F401 -- a missing TileLang makes the backend skip itself

    if not (arch.startswith("sm") and arch[2:].isdigit()):
        return False
    sm = int(arch[2:])
    if dtype == torch.bfloat16:
        return sm >= 80
    return dtype == torch.float16 and sm >= 70


DTYPE = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
