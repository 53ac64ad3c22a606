"""What every frozen quantized weight (fp8, int8, MXFP8) shows of itself: its stored tensor's metadata."""

from __future__ import annotations

import torch


class StoredWeight:
    """Base of the quantized weight records: `shape`, `dtype` and `device` are those of `data`."""

    data: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device
