"""The ops the reference-image (edit) layout adds or leans on: segment_attention (reference queries see
reference keys alone) and the AdaLN ops with a t = 0 modulation row picked per token."""

from __future__ import annotations

import math

import pytest
import torch

from kohakumoss_kernels import OpSet
from kohakumoss_kernels.registry import eager_op
from kohakumoss_kernels.shape_keys import shape_key

from .cases import compare, make_inputs, with_reference_row


def _segment_ids(cu: torch.Tensor, n: int) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(cu.numel() - 1), cu.diff().long())[:n]


def test_segment_attention_reference_equals_a_dense_masked_softmax():
    args, _ = make_inputs("segment_attention", [5, 1, 8], torch.float64, "cpu", heads=2, head_dim=8)
    q, k, v, cu_q, cu_kv, max_q, max_kv = args
    out = eager_op("segment_attention")(q, k, v, cu_q, cu_kv, max_q, max_kv)
    same = _segment_ids(cu_q, q.shape[0])[:, None] == _segment_ids(cu_kv, k.shape[0])[None, :]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    dense = torch.einsum("hqk,khd->qhd", scores.masked_fill(~same, float("-inf")).softmax(-1), v)
    torch.testing.assert_close(out, dense)
    # a query of one segment changes nothing in another's output
    q2 = q.detach().clone()
    q2[:5] += 1.0
    moved = eager_op("segment_attention")(q2, k, v, cu_q, cu_kv, max_q, max_kv)
    torch.testing.assert_close(moved[5:], out[5:])
    assert not torch.allclose(moved[:5], out[:5])


def test_segment_attention_refuses_unpaired_segments():
    q = torch.randn(4, 1, 8)
    with pytest.raises(ValueError, match="segments"):
        eager_op("segment_attention")(q, q, q, torch.tensor([0, 2, 4]), torch.tensor([0, 4]), 2, 4)
    with pytest.raises(ValueError, match="no keys"):
        eager_op("segment_attention")(q, q, q, torch.tensor([0, 2, 4]), torch.tensor([0, 4, 4]), 2, 4)


def test_segment_attention_through_the_op_set_and_its_shape_key():
    args, _ = make_inputs("segment_attention", [6, 3], torch.float32, "cpu", heads=2, head_dim=16)
    out = OpSet("auto").segment_attention(*args)
    torch.testing.assert_close(out, eager_op("segment_attention")(*args))
    assert shape_key("segment_attention", *args) == "segment_attention|fp32|T=64|Tk=64|H=2|D=16|L=64|S=4"


@pytest.mark.parametrize("op", ["norm_modulate", "gated_residual", "residual_norm_modulate"])
def test_adaln_ops_with_the_t0_row_picked_per_token(op):
    """The onehot backend (and the eager reference it is checked against) read row B for the tokens that
    point there, outputs and every parameter gradient included."""
    compare(op, "onehot", [5, 9, 3], torch.float32, "cpu", reference_row=True, d=40)
    args, _ = make_inputs(op, [5, 9, 3], torch.float32, "cpu", d=40)
    edited = with_reference_row(op, args)
    ts = next(a for a in edited if isinstance(a, torch.Tensor) and a.dtype == torch.long)
    assert ts.eq(3).sum() > 0 and ts.lt(3).sum() > 0
