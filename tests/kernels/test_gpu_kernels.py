"""Every GPU backend against the eager reference: mixed lengths (1, not multiples of the block),
bf16 and fp16, outputs and all input gradients; fresh outputs land on NaN-poisoned memory."""

from __future__ import annotations

import importlib

import pytest
import torch

from kohakumoss_kernels import OpSet, registry, tuning
from kohakumoss_kernels.backends import triton_utils

from .cases import compare, compare_mixed

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def default_launch_configs(monkeypatch):
    """The launch-config picker off (its first candidate), except where a test forces a config."""
    monkeypatch.setenv(triton_utils.ENV_PICK, "0")


LENGTHS = [[1], [1, 77, 300, 129], [513, 1, 64, 1000]]
DTYPES = [torch.bfloat16, torch.float16]
ROW_OPS = ["rms_norm", "norm_modulate", "gated_residual", "residual_norm_modulate", "situ_glu"]
HEAD_OPS = ["apply_rope", "qk_norm_rope"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("d", [1000, 3072])
@pytest.mark.parametrize("op", ROW_OPS)
def test_triton_row_ops(op, d, lengths, dtype):
    compare(op, "triton", lengths, dtype, "cuda", d=d)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("backend", ["triton", "onehot"])
def test_norm_modulate_fork(backend, lengths, dtype):
    compare("norm_modulate", backend, lengths, dtype, "cuda", op_kwargs={"fork": True}, d=3072)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spread", [40.0, 100.0])
@pytest.mark.parametrize("d", [1000, 8192])
def test_situ_glu_soft_caps(d, spread, dtype):
    """Inputs where 25 tanh(h / 25) and 4 tanh(g / 4) saturate (the MLP's width 8192 among them)."""
    compare("situ_glu", "triton", [1, 77, 300], dtype, "cuda", d=d, spread=spread)


MIXED = [  # (x, shift, gate dtype; the folded norm scale's dtype)
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float32),
]
TRAINED = {
    "norm_modulate": [("shift", "scale"), ("scale",), ("shift",), ()],
    "residual_norm_modulate": [("gate", "shift", "scale"), ("scale",), ("gate", "shift"), ()],
    "gated_residual": [("gate",), ()],
}


@pytest.mark.parametrize("dtypes", MIXED, ids=str)
@pytest.mark.parametrize(
    "op, trained, fork",
    [(op, t, False) for op, ts in TRAINED.items() for t in ts]
    + [("norm_modulate", t, True) for t in TRAINED["norm_modulate"]],
    ids=str,
)
def test_adaln_ops_take_the_models_mixed_dtypes(op, trained, fork, dtypes):
    """The model's call: bf16 activations and shift / gate, the norm weight folded into a float32 scale."""
    dtype, scale_dtype = dtypes
    kwargs = {"fork": True} if fork else {}
    compare_mixed(op, "triton", [513, 1, 64, 1000], dtype, "cuda", scale_dtype, trained, kwargs, d=3072)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ROW_OPS[:4] + ["qk_norm_rope", "norm_modulate_fork"])
def test_frozen_parameters(op, dtype):
    """Norm weights and AdaLN parameters that need no gradient (LoRA training): the backwards skip their
    sums (NEED_DW / NEED_SUMS); the input gradients stay right."""
    kwargs = {"op_kwargs": {"fork": True}} if op.endswith("_fork") else {}
    dims = {"heads": 24, "head_dim": 128} if op == "qk_norm_rope" else {"d": 3072}
    compare(
        op.removesuffix("_fork"), "triton", [513, 1, 64, 1000], dtype, "cuda", frozen=True, **kwargs, **dims
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("op", ["norm_modulate", "gated_residual", "residual_norm_modulate"])
def test_onehot_per_sample_ops(op, lengths, dtype):
    compare(op, "onehot", lengths, dtype, "cuda", d=3072)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("op", HEAD_OPS)
def test_triton_head_ops(op, lengths, dtype):
    compare(op, "triton", lengths, dtype, "cuda", heads=24, head_dim=128)


TUNED_OPS = {  # op: (module, the dims compare() gets)
    "rms_norm": ("rms_norm", {"d": 3072}),
    "norm_modulate": ("norm_modulate", {"d": 3072}),
    "gated_residual": ("gated_residual", {"d": 3072}),
    "residual_norm_modulate": ("residual_norm_modulate", {"d": 3072}),
    "qk_norm_rope": ("qk_norm_rope", {"heads": 24, "head_dim": 128}),
}


@pytest.mark.parametrize("op", list(TUNED_OPS))
def test_every_launch_config(op, monkeypatch):
    """Each launch-config candidate the picker may choose (forward and backward), at the real width."""
    folder, dims = TUNED_OPS[op]
    module = importlib.import_module(f"kohakumoss_kernels.ops.{folder}.triton")
    heads = "head_dim" in dims
    block = 2 * triton_utils.next_pow2(dims["head_dim"] // 2) if heads else 4096
    n = max(
        len(triton_utils.tile_configs(block, min_rows=2 if heads else 1, max_per_thread=64)) + 2 * heads,
        len(triton_utils.backward_configs(block, min_rows=2 if heads else 1)),
    )
    for i in range(n):
        monkeypatch.setattr(
            module, "pick", lambda name, key, cands, launch, i=i: cands[min(i, len(cands) - 1)]
        )
        compare(op, "triton", [513, 1, 64, 1000, 7], torch.bfloat16, "cuda", **dims)


def test_every_attention_launch_config(monkeypatch):
    """Each (BLOCK_M, BLOCK_N, num_warps, num_stages) candidate of the forward, dK/dV and dQ kernels."""
    from kohakumoss_kernels.ops.varlen_attention import triton as attention

    n = max(len(attention.FWD_CONFIGS), len(attention.DKDV_CONFIGS), len(attention.DQ_CONFIGS))
    for i in range(n):
        monkeypatch.setattr(
            attention, "pick", lambda name, key, cands, launch, i=i: cands[min(i, len(cands) - 1)]
        )
        compare(
            "varlen_attention",
            "triton",
            [513, 1, 64, 1000, 7],
            torch.bfloat16,
            "cuda",
            heads=24,
            head_dim=128,
        )


def test_per_sample_ops_backward_twice_through_a_retained_graph():
    """A 3-row sample inside one program's chunk of 8704 rows: its sums go through the atomics buffer,
    which only the first backward takes from the forward."""
    from .cases import backward_twice

    for op in ("norm_modulate", "gated_residual", "residual_norm_modulate"):
        backward_twice(op, "triton", [4000, 3, 4701], torch.bfloat16, "cuda", d=3072)


def test_rows_not_grouped_by_sample():
    """Per-sample gradients stay right when token_sample is not sorted (atomics path)."""
    from .cases import compare_shuffled

    for op in ("norm_modulate", "gated_residual", "residual_norm_modulate"):
        compare_shuffled(op, "triton", [300, 1, 77, 500], torch.bfloat16, "cuda", d=3072)


def test_rows_of_the_reference_layout():
    """The edit layout: runs of tokens read a t = 0 row B between the samples' own rows."""
    for op in ("norm_modulate", "gated_residual", "residual_norm_modulate"):
        compare(op, "triton", [300, 1, 77, 500], torch.bfloat16, "cuda", reference_row=True, d=3072)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", [[1, 5, 19], [4096 + 90, 4096 + 40]], ids=str)
@pytest.mark.parametrize("backend", ["torch_varlen", "flex"])
def test_segment_attention_backends(backend, lengths, dtype):
    """Reference queries over reference keys alone, target and text over the whole sample."""
    if registry.load_backend("segment_attention", backend, "sm90", dtype) is None:
        pytest.skip(f"{backend} not available here")
    if backend == "flex" and lengths != [1, 5, 19]:
        pytest.skip("flex recompiles per token count; one mixed-length case is enough")
    heads = 2 if sum(lengths) > 4000 else 4
    compare("segment_attention", backend, lengths, dtype, "cuda", heads=heads, head_dim=128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# the last: the trainer's layout, two 1 MP samples with captions of 40 and 90 tokens and the pad segment
@pytest.mark.parametrize(
    "lengths", LENGTHS + [[4096 + 256, 4096 + 256], [4096 + 40, 4096 + 90, 126]], ids=str
)
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
@pytest.mark.parametrize(
    "backend", ["triton", "addmm", "addmm_lora_first", "addmm_lowrank"]
)  # triton: lycoris-lora's fused bypass
def test_lora_linear(backend, dtype):
    compare("lora_linear", backend, [1, 77, 300], dtype, "cuda", d=256)


@pytest.mark.parametrize("op", ["rms_norm", "situ_glu", "norm_modulate"])
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


def test_pick_times_launch_configs_without_allocating(monkeypatch):
    """The picker runs inside a capped card's first step: it must choose by device time and allocate
    nothing (triton's do_bench would take a 256 MB flush buffer)."""
    monkeypatch.setenv(triton_utils.ENV_PICK, "1")
    x = torch.zeros(1 << 20, device="cuda")

    def launch(config):
        if config == ("slow",):
            torch.cuda._sleep(1_000_000)  # ~0.5 ms of spinning on the device
        x.add_(1.0)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    best = triton_utils.pick("test.pick", (id(x),), [("slow",), ("fast",)], launch)
    assert best == ("fast",)
    assert torch.cuda.max_memory_allocated() == before


def test_pick_times_the_device_not_the_hosts_launch_overhead(monkeypatch):
    """The step replays from a CUDA graph, where a launch's host work costs nothing: a config that is
    slow to launch but quick on the device must win over one that launches fast and runs long."""
    import time

    monkeypatch.setenv(triton_utils.ENV_PICK, "1")
    x = torch.zeros(1 << 16, device="cuda")

    def launch(config):
        if config == ("slow_host",):
            time.sleep(0.0005)  # 10 reps: 5 ms, inside the picker's ~10 ms hold of the stream
        else:
            torch.cuda._sleep(200_000)  # ~0.1 ms on the device
        x.add_(1.0)

    best = triton_utils.pick("test.pick_host", (id(x),), [("slow_device",), ("slow_host",)], launch)
    assert best == ("slow_host",)


@pytest.mark.parametrize("backend", ["triton", "torch_varlen"])
def test_attention_graph_replays_other_lengths(backend):
    """A graph of forward and backward captured at one batch's lengths, replayed with another's (same
    token count, cu_seqlens copied in, the bound kept): the eager reference's outputs and gradients."""
    dtype = torch.bfloat16
    fn = registry.load_backend("varlen_attention", backend, "sm90", dtype)
    if fn is None:
        pytest.skip(f"{backend} not available here")
    assert getattr(fn, "device_lengths", False)
    T, H, D, bound = 1024, 4, 128, 768
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad = (torch.randn(T, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, 600, 900, T], device="cuda", dtype=torch.int32)

    def step():
        out = fn(q, k, v, cu, bound)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    cu.copy_(torch.tensor([0, 100, 800, T], device="cuda", dtype=torch.int32))
    with torch.no_grad():
        for t in (q, k, v, grad):
            t.normal_(generator=g)
    graph.replay()
    ref_args = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = registry.eager_op("varlen_attention")(*ref_args, cu.clone(), bound)
    ref_grads = torch.autograd.grad(ref, ref_args, grad.float())
    for got, want in zip(static, (ref, *ref_grads), strict=True):
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


def test_timing_captures_share_one_pool_freed_when_the_window_ends():
    """Device-time timing of many candidates holds about one candidate's buffers (one shared pool), and
    nothing once the tuning window ends: a pool per capture held all eight (4 GiB in a capped first step)."""
    mib = 1 << 20
    x = torch.randn(16 * mib, device="cuda")  # 64 MiB
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    with tuning.tuning_window():
        for _ in range(8):
            tuning.time_call(lambda t: t * 2, (x,), {}, device_time=True)  # a fresh 64 MiB output per call
        during = torch.cuda.memory_reserved() - before
    after = torch.cuda.memory_reserved() - before
    assert during < 320 * mib, during / mib
    assert after <= 16 * mib, after / mib
