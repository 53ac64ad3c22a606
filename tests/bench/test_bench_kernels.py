"""scripts/bench/bench_kernels.py's block (the benchmark's model of one MOSS block) on the CPU at tiny widths:
it runs forward and backward through the registry and equals the same block on the eager ops."""

from __future__ import annotations

import runpy
from pathlib import Path

import torch

from kohakumoss_kernels import OpSet

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_kernels.py"


def test_block_runs_and_matches_eager_on_the_cpu():
    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    glb = bench["block"].__globals__
    glb.update(D_MODEL=64, HEADS=2, HEAD_DIM=32, MLP_HIDDEN=96, DEVICE="cpu", LORA_RANK=4)
    p = glb["block_params"](torch.float32, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    T, L = 40, 20
    x0 = torch.randn(T, 64, generator=g)
    mod = [torch.randn(2, 64, generator=g) * 0.1 for _ in range(6)]
    ts = torch.arange(2).repeat_interleave(L)
    cu = torch.arange(3, dtype=torch.int32) * L
    ang = torch.rand(T, 16, generator=g)
    results = []
    for ops in (OpSet("eager"), OpSet("addmm,onehot", tune="off")):
        x = x0.clone().requires_grad_(True)
        out = glb["block"](ops, p, x, mod, ts, cu, L, ang.cos(), ang.sin())
        out.square().sum().backward()
        results.append((out.detach(), x.grad))
    (ref, ref_grad), (out, grad) = results
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-4, rtol=1e-4)
    assert grad.abs().sum() > 0


def test_lora_cases_run_through_their_backends_on_the_cpu():
    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    glb = bench["lora_cases"].__globals__
    glb.update(D_MODEL=32, MLP_HIDDEN=48, IMAGE_TOKENS=16, TEXT_TOKENS=4, DEVICE="cpu", LORA_RANK=4)
    from kohakumoss_kernels import registry

    cases = glb["lora_cases"](torch.float32, torch.Generator().manual_seed(0))
    assert [op for _, op, _, _ in cases] == ["lora_linear"] * 3 + ["lora_group"]
    for _, op, args, floor in cases:
        assert floor > 0
        for fn in (registry.eager_op(op), registry.load_backend(op, "addmm", "cpu", torch.float32)):
            out = fn(*args)
            outs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            assert all(t.grad is not None for t in glb["_group_leaves"](args))
            for t in glb["_group_leaves"](args):
                t.grad = None
    row = {"op": "lora_linear o", "backend": "addmm", "base_fwd_bwd_ms": 0.4, "fwd_bwd_ms": 0.6}
    row.update(lora_extra_ms=0.2, lora_floor_ms=0.1)
    table = glb["lora_table"]([row, {"op": "rms_norm", "backend": "triton"}])
    assert table.count("\n") == 2 and "| 0.200 | 0.100 |" in table
    assert glb["table"]([row]).count("\n") == 1  # the op table leaves the LoRA rows to lora_table


def test_bandwidth_table_sets_each_op_against_the_copy_ceiling_and_a_same_size_copy():
    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    row = {"op": "rms_norm", "backend": "triton", "fwd_GBps": 3000.0, "fwd_bwd_GBps": 3500.0}
    row.update(fwd_pct_ceiling=75.0, fwd_bwd_pct_ceiling=87.5)
    row.update(copy_same_fwd_GBps=3750.0, copy_same_fwd_bwd_GBps=3500.0)
    lines = bench["bandwidth_table"]([row], {"copy_GBps": 4000.0}).splitlines()
    assert "80% = 3200 GB/s" in lines[0]
    cells = lines[-1].split()
    assert cells[2:6] == ["3000", "75", "3500", "88"] and "not met / met" in lines[-1]
    assert cells[-6:] == ["3750", "/", "3500", "80", "/", "100"]  # same-size copies, then % of them


def test_ops_knob_is_checked_and_frozen_rows_freeze_only_parameters():
    import pytest

    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    glb = bench["inputs"].__globals__
    glb.update(D_MODEL=16, HEADS=2, HEAD_DIM=8, MLP_HIDDEN=12, IMAGE_TOKENS=6, TEXT_TOKENS=2, DEVICE="cpu")
    assert glb["check_ops"]("rms_norm, norm_modulate_fork_frozen,qk_norm_rope_frozen") == [
        "rms_norm",
        "norm_modulate_fork_frozen",
        "qk_norm_rope_frozen",
    ]
    assert glb["check_ops"](bench["OPS"])  # the default list is valid
    for bad in ("norm_modulat", "varlen_attention_frozen", "situ_glu_fork"):
        with pytest.raises(SystemExit, match="OPS: unknown op"):
            glb["check_ops"](bad)
    assert glb["base_op"]("norm_modulate_fork_frozen") == ("norm_modulate", True, True)

    g = torch.Generator().manual_seed(0)
    trained, _, _ = glb["inputs"]("norm_modulate", torch.float32, g)
    frozen, fb, bb = glb["inputs"]("norm_modulate_frozen", torch.float32, g)
    assert [getattr(a, "requires_grad", None) for a in trained[:3]] == [True, True, True]
    assert [getattr(a, "requires_grad", None) for a in frozen[:3]] == [True, False, False]
    assert (fb, bb) == glb["inputs"]("norm_modulate", torch.float32, g)[1:]  # the same bytes counted
    q = glb["inputs"]("qk_norm_rope_frozen", torch.float32, g)[0]
    assert q[0].requires_grad and not q[1].requires_grad  # x trains, the q/k norm weight does not


def test_attention_rows_take_the_trainers_layout_with_captions():
    """ATTN_CAPTIONS: the attention rows' runs are the trainer's (PackedSeq with its pad segment), the
    FLOPs count those runs, and every backend's row equals the eager one on them (CPU, tiny widths)."""
    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    glb = bench["attention_inputs"].__globals__
    glb.update(HEADS=2, HEAD_DIM=16, IMAGE_TOKENS=64, ATTN_CAPTIONS="5,40", DEVICE="cpu")
    assert glb["attention_lengths"]() == [69, 104, 83]  # 64 + 5, 64 + 40, then pad to 256 tokens
    layout = glb["trainer_layout"]()
    assert layout.max_seqlen == 128 and layout.text_pad == 83
    q, k, v, cu, bound = glb["attention_inputs"](lambda *s: torch.randn(*s), None, None)
    assert q.shape[0] == 256 and bound == 128
    from kohakumoss_kernels.ops.varlen_attention import eager, sdpa_groups

    want = eager.varlen_attention(q, k, v, cu, bound)
    got = sdpa_groups.varlen_attention(q, k, v, cu, bound)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
