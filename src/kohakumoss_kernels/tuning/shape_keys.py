"""Shape keys: the tuning table's row names, one per (op, dtype, bucketed problem size).

A key is `op|dtype|dim=value|...`. Model widths (d, heads, head_dim) are kept exact; the token
count T and max_seqlen are rounded up to a power of two (at least 64) so that every packed batch
of a similar size shares a row. The ops over a stored (fp8 / int8 / MXFP8) weight add its kind first
(`lora_linear|bf16|W=fp8|T=...`, `stored_linear|bf16|W=int8|T=...`): other backends race there.
An op whose backends changed since its rows were stored ends its keys in `|r<revision>` (`OpSpec.revision`),
so those rows are timed again. No key needs a device-to-host copy.

Each op's `OpSpec.dims` (op_list.py) names the function here that reads its dims (rows and width unless it
says otherwise); `op_list.shape_key` builds the key of a call from its spec.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..weights.stored_weight import weight_kind

_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def bucket(n: int) -> int:
    """Round n up to a power of two, at least 64."""
    n = max(int(n), 64)
    return 1 << (n - 1).bit_length()


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE.get(dtype, str(dtype).removeprefix("torch."))


def rows(x: torch.Tensor, *args, **kwargs) -> dict[str, int]:
    """A row op's dims: its bucketed rows and its width."""
    return {"T": bucket(x.shape[0]), "d": x.shape[-1]}


def attention(q, k, v, cu_seqlens, max_seqlen, *args, **kwargs) -> dict[str, int]:
    return {
        "T": bucket(q.shape[0]),
        "H": q.shape[1],
        "D": q.shape[2],
        "L": bucket(max_seqlen),
        "B": cu_seqlens.numel() - 1,
    }


def segment_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, *args, **kwargs) -> dict[str, int]:
    """Attention whose query and key segments differ (an edit batch's references): both token counts."""
    return {
        "T": bucket(q.shape[0]),
        "Tk": bucket(k.shape[0]),
        "H": q.shape[1],
        "D": q.shape[2],
        "L": bucket(max_seqlen_q),
        "S": cu_seqlens_q.numel() - 1,
    }


def heads(x, *args, **kwargs) -> dict[str, int]:
    """A per-head op's dims (rotary, q/k norm)."""
    return {"T": bucket(x.shape[0]), "H": x.shape[1], "D": x.shape[2]}


def _linear(x, weight, *args, **kwargs) -> dict[str, int]:
    return {"T": bucket(x.reshape(-1, x.shape[-1]).shape[0]), "I": weight.shape[1], "O": weight.shape[0]}


def _kind(weight) -> dict[str, str]:
    """W=<kind> for a stored weight; nothing for a tensor (the plain rows keep their names)."""
    kind = weight_kind(weight)
    return {} if kind == "dense" else {"W": kind}


def weighted(x, weight, *args, **kwargs) -> dict[str, int | str]:
    """A linear over a frozen weight of any kind (lora_linear, stored_linear)."""
    return {**_kind(weight), **_linear(x, weight)}


def lora_group(x, weights, *args, **kwargs) -> dict[str, int | str]:
    """The group's members' dims: their weight kind, rows, input width and each member's outputs."""
    outs = ",".join(str(w.shape[0]) for w in weights)
    rows = bucket(x.reshape(-1, x.shape[-1]).shape[0])
    return {**_kind(weights[0]), "T": rows, "I": weights[0].shape[1], "O": outs}


Dims = Callable[..., dict[str, int | str]]


def key(op: str, dims: Dims, revision: int, *args, **kwargs) -> str:
    """The documented key of one call: op, dtype of the first tensor, its bucketed dims, `r<revision>`
    past the first."""
    found = dims(*args, **kwargs)
    tail = [f"r{revision}"] if revision > 1 else []
    return "|".join([op, dtype_name(args[0].dtype), *(f"{k}={v}" for k, v in found.items()), *tail])
