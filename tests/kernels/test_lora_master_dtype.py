"""LoRA weights kept in fp32 (the optimizer's masters) while the linear computes in x's dtype: the addmm
backends cast inside, scale through cuBLAS's alpha, and return each gradient in its parameter's dtype,
as the eager reference (whose autograd casts) does."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kohakumoss_kernels.ops.lora_group.addmm import lora_group
from kohakumoss_kernels.ops.lora_linear.addmm import lora_linear
from kohakumoss_kernels.registry import eager_op
from kohakumoss_kernels.runtime import grad_sink


def _inputs(compute, device, outs=(7,), ranks=(3,), d=6, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, dtype, grad, scale=1.0):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
        return t.to(device, dtype).requires_grad_(grad)

    x = rnd(9, d, dtype=compute, grad=True)
    ws = [rnd(o, d, dtype=compute, grad=False, scale=d**-0.5) for o in outs]
    bs = [rnd(o, dtype=compute, grad=False) for o in outs]
    downs = [rnd(r, d, dtype=torch.float32, grad=True, scale=d**-0.5) for r in ranks]
    ups = [rnd(o, r, dtype=torch.float32, grad=True) for o, r in zip(outs, ranks, strict=True)]
    return x, ws, bs, downs, ups


def _grads(outs, leaves, seed=1):
    g = torch.Generator().manual_seed(seed)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in outs])
    return [t.grad for t in leaves]


def _check(got, ref, dtype_of, tol):
    for a, r, p in zip(got, ref, dtype_of, strict=True):
        assert a is not None and a.dtype == p.dtype, (a.dtype if a is not None else None, p.dtype)
        torch.testing.assert_close(a.float(), r.float(), atol=tol * r.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("lora_first", [False, True])
def test_lora_linear_returns_master_dtype_grads(lora_first):
    x, (w,), (b,), (d,), (u,) = _inputs(torch.float64, "cpu")
    got = _grads([lora_linear(x, w, b, d, u, 0.7, lora_first)], [x, d, u])
    x2, (w2,), (b2,), (d2,), (u2,) = _inputs(torch.float64, "cpu")
    ref = _grads([eager_op("lora_linear")(x2, w2, b2, d2, u2, 0.7)], [x2, d2, u2])
    _check(got, ref, [x, d, u], 1e-6)


@pytest.mark.parametrize("lora_first", [False, True])
@pytest.mark.parametrize("scales", [(0.5, 0.5, 0.5), (0.7, 1.0, 0.25)])  # shared: H carries the scale
def test_lora_group_returns_master_dtype_grads(scales, lora_first):
    def run(op):
        x, ws, bs, downs, ups = _inputs(torch.float64, "cpu", outs=(7, 7, 5), ranks=(3, 2, 3))
        outs = op(x, ws, bs, downs, ups, scales)
        return outs, _grads(list(outs), [x, *downs, *ups]), [x, *downs, *ups]

    outs, got, leaves = run(lambda *a: lora_group(*a, lora_first=lora_first))
    ref_outs, ref, _ = run(eager_op("lora_group"))
    for a, r in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(a, r)
    _check(got, ref, leaves, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
@pytest.mark.parametrize("backend", ["addmm", "addmm_lora_first", "addmm_lowrank", "triton"])
def test_cuda_bf16_compute_with_fp32_masters(backend):
    from kohakumoss_kernels.registry import backend_fn

    fn = backend_fn("lora_linear", backend)  # addmm_lora_first and addmm_lowrank: addmm's variants
    x, (w,), (b,), (d,), (u,) = _inputs(torch.bfloat16, "cuda", outs=(320,), ranks=(32,), d=256)
    out = fn(x, w, b, d, u, 0.5)
    seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out.backward(seed)
    got = [x.grad, d.grad, u.grad]
    casts = [e.key for e in prof.key_averages() if e.key in ("aten::_to_copy", "aten::mul_", "aten::mul")]
    if backend in ("addmm", "addmm_lora_first"):  # lowrank and triton cast (one dtype per kernel)
        assert casts == [], casts  # fp32 grads straight from cuBLAS, the scale as alpha
    x2, (w2,), (b2,), (d2,), (u2,) = _inputs(torch.bfloat16, "cuda", outs=(320,), ranks=(32,), d=256)
    x2 = x2.detach().float().requires_grad_(True)  # the reference in float32 from the same rounded values
    ref = _grads([eager_op("lora_linear")(x2, w2.float(), b2.float(), d2, u2, 0.5)], [x2, d2, u2])
    _check(got, ref, [x, d, u], 3e-2)


class _AddCount(TorchDispatchMode):
    def __enter__(self):
        self.n = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in (torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor)
        return func(*args, **(kwargs or {}))


def _sunk_grads(op, compute, device, prior, **kw):
    """Grads of op's LoRA masters accumulated into `prior` inside a grad_sink window (x's returned)."""
    x, ws, bs, downs, ups = _inputs(compute, device, **kw)
    for t, p in zip([*downs, *ups], prior, strict=True):
        t.grad = p.clone()
    buffers = [t.grad for t in (*downs, *ups)]
    with grad_sink.into([*downs, *ups]), _AddCount() as adds:
        outs = op(x, ws, bs, downs, ups)
        _grads(list(outs) if isinstance(outs, tuple) else [outs], [x])
    assert all(t.grad is b for t, b in zip([*downs, *ups], buffers, strict=True))  # the same buffers
    if compute == torch.float32:  # autograd would add each returned gradient into .grad
        assert adds.n == 0, adds.n
    return [x.grad, *buffers]


def _returned_grads(op, compute, device, prior, **kw):
    x, ws, bs, downs, ups = _inputs(compute, device, **kw)
    outs = op(x, ws, bs, downs, ups)
    got = _grads(list(outs) if isinstance(outs, tuple) else [outs], [x, *downs, *ups])
    return [got[0], *(g + p for g, p in zip(got[1:], prior, strict=True))]


SINK_CASES = {
    "linear": (lambda x, ws, bs, ds, us: lora_linear(x, ws[0], bs[0], ds[0], us[0], 0.7), {}),
    "linear_lora_first": (
        lambda x, ws, bs, ds, us: lora_linear(x, ws[0], bs[0], ds[0], us[0], 0.7, True),
        {},
    ),
    "group_shared": (
        lambda x, ws, bs, ds, us: lora_group(x, ws, bs, ds, us, (0.5, 0.5, 0.5)),
        {"outs": (7, 7, 5), "ranks": (3, 2, 3)},
    ),
    "group_scales": (
        lambda x, ws, bs, ds, us: lora_group(x, ws, bs, ds, us, (0.7, 1.0, 0.25)),
        {"outs": (7, 7, 5), "ranks": (3, 2, 3)},
    ),
}


@pytest.mark.parametrize("case", list(SINK_CASES))
def test_grad_sink_accumulates_what_autograd_would_add(case):
    op, kw = SINK_CASES[case]
    shapes = [
        t.shape for t in (*_inputs(torch.float64, "cpu", **kw)[3], *_inputs(torch.float64, "cpu", **kw)[4])
    ]
    g = torch.Generator().manual_seed(5)
    prior = [torch.randn(s, generator=g) for s in shapes]  # what earlier micro-steps left in .grad
    for compute in (torch.float64, torch.float32):
        got = _sunk_grads(op, compute, "cpu", prior, **kw)
        ref = _returned_grads(op, compute, "cpu", prior, **kw)
        for a, r in zip(got, ref, strict=True):
            torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)
    assert all(a.dtype == torch.float32 for a in got[1:])


LOWRANK_SINK_CASES = {  # the Triton rank-r kernels add into .grad with atomics (CUDA, or the interpreter)
    "linear_lowrank": (
        lambda x, ws, bs, ds, us: lora_linear(x, ws[0], bs[0], ds[0], us[0], 0.7, True, lowrank=True),
        {},
    ),
    "group_lowrank": (
        lambda x, ws, bs, ds, us: lora_group(x, ws, bs, ds, us, (0.7, 1.0, 0.25), lowrank=True),
        {"outs": (7, 7, 5), "ranks": (3, 2, 3)},
    ),
}


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
@pytest.mark.parametrize("case", [*SINK_CASES, *LOWRANK_SINK_CASES])
def test_cuda_grad_sink_bf16_products_into_fp32_grads(case):
    op, kw = {**SINK_CASES, **LOWRANK_SINK_CASES}[case]
    kw = {**kw, "d": 256}
    shapes = [
        t.shape
        for t in (*_inputs(torch.bfloat16, "cuda", **kw)[3], *_inputs(torch.bfloat16, "cuda", **kw)[4])
    ]
    g = torch.Generator().manual_seed(5)
    prior = [torch.randn(s, generator=g).cuda() for s in shapes]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = _sunk_grads(op, torch.bfloat16, "cuda", prior, **kw)
    adds = [e.key for e in prof.key_averages() if e.key in ("aten::add_", "aten::add")]
    assert adds == [], adds  # the GEMMs accumulate (a group's downs: one _foreach_add_)
    ref = _returned_grads(op, torch.bfloat16, "cuda", prior, **kw)
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a.float(), r.float(), atol=2e-2 * r.abs().max().item(), rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
def test_cuda_lowrank_runs_each_rank_r_product_as_one_launch():
    """x down^T, gy up and the two weight gradients: one Triton kernel each, the gradients added into the
    sunk `.grad` by that kernel (no split-K reduce, no zeroing, no add after it)."""
    x, (w,), (b,), (d,), (u,) = _inputs(torch.bfloat16, "cuda", outs=(320,), ranks=(32,), d=256)
    x = x.detach().repeat(64, 1).requires_grad_(True)  # 576 tokens: several row programs
    d.grad, u.grad = torch.zeros_like(d), torch.zeros_like(u)
    seed = torch.randn(x.shape[0], 320, device="cuda", dtype=torch.bfloat16)
    lora_linear(x, w, b, d, u, 0.7, True, lowrank=True).backward(seed)  # compiles and picks outside
    x.grad = None  # else autograd adds the next one into it
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with grad_sink.into([d, u]):
            lora_linear(x, w, b, d, u, 0.7, True, lowrank=True).backward(seed)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum(n.startswith("_lowrank_rows") for n in names) == 2, names
    assert sum(n.startswith("_lowrank_cols_into") for n in names) == 2, names
    extra = [n for n in names if "splitKreduce" in n or "elementwise" in n or "reduce_kernel" in n]
    assert [n for n in extra if "copy_kernel" not in n] == [], extra  # the masters' casts aside (cast_once)
