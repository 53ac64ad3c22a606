"""Shape keys: the tuning table's row names, one per (op, dtype, bucketed problem size).

A key is `op|dtype|dim=value|...`. Model widths (d, heads, head_dim) are kept exact; the token
count T and max_seqlen are rounded up to a power of two (at least 64) so that every packed batch
of a similar size shares a row. No key needs a device-to-host copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def bucket(n: int) -> int:
    """Round n up to a power of two, at least 64."""
    n = max(int(n), 64)
    return 1 << (n - 1).bit_length()


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE.get(dtype, str(dtype).removeprefix("torch."))


def _rows(x: torch.Tensor) -> dict[str, int]:
    return {"T": bucket(x.shape[0]), "d": x.shape[-1]}


def _attention(q, k, v, cu_seqlens, max_seqlen, *args, **kwargs) -> dict[str, int]:
    return {
        "T": bucket(q.shape[0]),
        "H": q.shape[1],
        "D": q.shape[2],
        "L": bucket(max_seqlen),
        "B": cu_seqlens.numel() - 1,
    }


def _rope(x, *args, **kwargs) -> dict[str, int]:
    return {"T": bucket(x.shape[0]), "H": x.shape[1], "D": x.shape[2]}


def _lora(x, weight, *args, **kwargs) -> dict[str, int]:
    return {"T": bucket(x.reshape(-1, x.shape[-1]).shape[0]), "I": weight.shape[1], "O": weight.shape[0]}


def _lora_group(x, weights, *args, **kwargs) -> dict[str, int | str]:
    outs = ",".join(str(w.shape[0]) for w in weights)
    return {"T": bucket(x.reshape(-1, x.shape[-1]).shape[0]), "I": weights[0].shape[1], "O": outs}


_DIMS: dict[str, Callable[..., dict[str, int | str]]] = {
    "varlen_attention": _attention,
    "apply_rope": _rope,
    "qk_norm_rope": _rope,
    "lora_linear": _lora,
    "lora_group": _lora_group,
    "lora_linear_fp8": _lora,
    "lora_group_fp8": _lora_group,
    "int8_linear": _lora,
    "lora_linear_int8": _lora,
    "lora_group_int8": _lora_group,
    "mxfp8_linear": _lora,
    "lora_linear_mxfp8": _lora,
    "lora_group_mxfp8": _lora_group,
}


def shape_key(op: str, *args, **kwargs) -> str:
    """The documented key of one call: op, dtype of the first tensor, then its bucketed dims."""
    x = args[0]
    dims = _DIMS.get(op, lambda x, *a, **k: _rows(x))(*args, **kwargs)
    return "|".join([op, dtype_name(x.dtype), *(f"{k}={v}" for k, v in dims.items())])
