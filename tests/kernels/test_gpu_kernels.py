"""Every GPU backend against the eager reference: mixed lengths (1, not multiples of the block),
bf16 and fp16, outputs and all input gradients; fresh outputs land on NaN-poisoned memory."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels import OpSet, registry, tuning

from .cases import compare

pytestmark = pytest.mark.gpu

LENGTHS = [[1], [1, 77, 300, 129], [513, 1, 64, 1000]]
DTYPES = [torch.bfloat16, torch.float16]
ROW_OPS = ["rms_norm", "norm_modulate", "gated_residual", "residual_norm_modulate", "swiglu"]
HEAD_OPS = ["apply_rope", "qk_norm_rope"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("d", [1000, 3072])
@pytest.mark.parametrize("op", ROW_OPS)
def test_triton_row_ops(op, d, lengths, dtype):
    compare(op, "triton", lengths, dtype, "cuda", d=d)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("op", HEAD_OPS)
def test_triton_head_ops(op, lengths, dtype):
    compare(op, "triton", lengths, dtype, "cuda", heads=24, head_dim=128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS + [[4096 + 256, 4096 + 256]], ids=str)
@pytest.mark.parametrize("backend", ["triton", "sdpa_groups", "torch_varlen", "flex"])
def test_attention_backends(backend, lengths, dtype):
    if (
        not registry.has_backend("varlen_attention", backend)
        or registry.load_backend("varlen_attention", backend, "sm90", dtype) is None
    ):
        pytest.skip(f"{backend} not available here")
    if backend == "flex" and lengths != LENGTHS[1]:
        pytest.skip("flex recompiles per token count; one mixed-length case is enough")
    heads = 2 if sum(lengths) > 4000 else 4
    compare("varlen_attention", backend, lengths, dtype, "cuda", heads=heads, head_dim=128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["triton", "addmm"])  # triton: lycoris-lora's fused bypass
def test_lora_linear(backend, dtype):
    compare("lora_linear", backend, [1, 77, 300], dtype, "cuda", d=256)


@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "norm_modulate"])
def test_compile_backend(op):
    compare(op, "compile", [1, 77, 300], torch.bfloat16, "cuda", d=512)


def test_opset_auto_prefers_triton_on_this_card(tmp_path, monkeypatch):
    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path))
    tuning._tables.clear()
    ops = OpSet("auto", tune="table")
    x = torch.randn(300, 3072, device="cuda", dtype=torch.bfloat16)
    bound = ops.bind("rms_norm", x.device, x.dtype)
    assert bound.names[0] == "triton" and bound.names[-1] == "eager"
    q = torch.randn(600, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, 300, 600], device="cuda", dtype=torch.int32)
    with ops.tuning():
        out = ops.varlen_attention(q, q, q, cu, 300)
    out.sum().backward()
    entries = tuning.table_for(tuning.card_name("cuda")).entries
    key = next(k for k in entries if k.startswith("varlen_attention"))
    assert {"triton", "eager"} <= set(entries[key]["ms"])
    assert (tmp_path / "tuning").exists()
    tuning._tables.clear()
