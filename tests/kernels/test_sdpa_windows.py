"""The windowed SDPA backend of varlen_attention against the eager reference (CPU, float32): runs of
any mix of lengths in windows of the bound, the last run in a window of its own when `tail` bounds it."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels.host_values import register_host_values
from kohakumoss_kernels.ops.varlen_attention import eager, sdpa_windows


def _cu(lengths: list[int]) -> torch.Tensor:
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return register_host_values(torch.tensor(bounds, dtype=torch.int32), bounds)


@pytest.mark.parametrize(
    "lengths, bound, tail",
    [
        ([37, 64, 5], 64, 0),  # every run in a window of the bound
        ([40, 61, 7], 64, 8),  # the last run (a pad segment) in a window of 8
        ([64, 1], 64, 1),
        ([20, 0, 30, 3], 32, 4),  # an empty run gives no rows and no NaN
    ],
)
def test_windows_equal_the_reference(lengths, bound, tail):
    g = torch.Generator().manual_seed(0)
    T, H, D = sum(lengths), 3, 16
    q, k, v, grad = (torch.randn(T, H, D, generator=g) for _ in range(4))
    cu = _cu(lengths)

    def run(fn, **kw):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, cu, bound, 0.3, **kw)
        return (out, *torch.autograd.grad(out, leaves, grad))

    for got, want in zip(
        run(sdpa_windows.varlen_attention, tail=tail), run(eager.varlen_attention), strict=True
    ):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_slots_place_each_run_in_its_window():
    cu = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    assert sdpa_windows.window_slots(cu, 7, 4, 0).tolist() == [0, 1, 2, 4, 5, 8, 9]
    assert sdpa_windows.window_slots(cu, 7, 4, 2).tolist() == [0, 1, 2, 4, 5, 8, 9]  # tail right after
    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    assert sdpa_windows.window_slots(cu, 6, 3, 2).tolist() == [0, 1, 2, 3, 6, 7]
