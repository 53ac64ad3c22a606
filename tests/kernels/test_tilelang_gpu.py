"""The TileLang backends (built for sm70/sm75, where no card is reachable here) against the eager
reference on whatever CUDA card runs them (TileLang also builds for sm80+): outputs and input gradients,
fp16 and bf16 (bf16 from sm80), mixed lengths. Skipped where TileLang is not installed; CLAUDE.md says
how to carry it to the H200 (.ci/tilelang-wheels: the wheels and libz3 fit the device tool's limit)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from .cases import compare

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="TileLang is not installed"),
]


def dtypes() -> list[torch.dtype]:
    bf16 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
    return [torch.float16, *([torch.bfloat16] if bf16 else [])]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lengths", [[1], [1, 77, 300, 129]], ids=str)
@pytest.mark.parametrize("d", [1000, 3072])
def test_rms_norm(d, lengths, dtype):
    if dtype not in dtypes():
        pytest.skip("bf16 needs sm80+")
    compare("rms_norm", "tilelang", lengths, dtype, "cuda", d=d)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lengths", [[1], [1, 77, 300, 129], [513, 1, 64, 1000]], ids=str)
def test_varlen_attention(lengths, dtype, monkeypatch):
    if dtype not in dtypes():
        pytest.skip("bf16 needs sm80+")
    from kohakumoss_kernels.ops.varlen_attention import tilelang as tl_attention

    def no_fallback(*args):
        raise AssertionError("the TileLang attention backward did not run (fell back to Triton)")

    monkeypatch.setattr(tl_attention, "_backward_triton", no_fallback)
    compare("varlen_attention", "tilelang", lengths, dtype, "cuda", heads=4, head_dim=128)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lengths", [[1], [1, 77, 300, 129]], ids=str)
def test_qk_norm_rope(lengths, dtype):
    if dtype not in dtypes():
        pytest.skip("bf16 needs sm80+")
    compare("qk_norm_rope", "tilelang", lengths, dtype, "cuda", heads=24, head_dim=128)
