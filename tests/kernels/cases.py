"""Random inputs per op and the comparison against eager, shared by the GPU tests and the interpreter run."""

from __future__ import annotations

import importlib
from unittest import mock

import torch

from kohakumoss_kernels import sample_sums
from kohakumoss_kernels.registry import _OPS, eager_op

TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (2e-2, 2e-2), torch.bfloat16: (6e-2, 6e-2)}


def cu_seqlens(lengths: list[int], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    token_sample = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return cu.to(device), token_sample.to(device), max(lengths)


def make_inputs(
    op: str,
    lengths: list[int],
    dtype,
    device,
    d: int = 48,
    heads: int = 3,
    head_dim: int = 32,
    seed: int = 0,
    frozen: bool = False,
) -> tuple[tuple, dict]:
    """(args, kwargs) for one call of `op`; float tensors that take gradients require them. frozen: the
    norm weights and per-sample AdaLN parameters do not (LoRA training), so the backwards skip them."""
    g = torch.Generator().manual_seed(seed)
    p = not frozen  # the parameters' requires_grad

    def rnd(*shape, grad=True, scale=1.0, dt=dtype):
        t = (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)
        return t.requires_grad_(grad)

    cu, ts, max_len = cu_seqlens(lengths, device)
    T, B = sum(lengths), len(lengths)
    ang = torch.rand(T, head_dim // 2, generator=g) * 6.28
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    if op == "rms_norm":
        return (rnd(T, d), rnd(d, grad=p), 1e-6), {}
    if op == "norm_modulate":
        return (rnd(T, d), rnd(B, d, scale=0.5, grad=p), rnd(B, d, scale=0.5, grad=p), ts, 1e-6), {}
    if op == "gated_residual":
        return (rnd(T, d), rnd(T, d), rnd(B, d, grad=p), ts), {}
    if op == "residual_norm_modulate":
        args = (
            rnd(T, d),
            rnd(T, d),
            rnd(B, d, grad=p),
            rnd(B, d, scale=0.5, grad=p),
            rnd(B, d, scale=0.5, grad=p),
        )
        return (*args, ts, 1e-6), {}
    if op == "apply_rope":
        return (rnd(T, heads, head_dim), cos, sin), {}
    if op == "qk_norm_rope":
        return (rnd(T, heads, head_dim), rnd(head_dim, grad=p), cos, sin, 1e-6), {}
    if op == "swiglu":
        return (rnd(T, 2 * d),), {}
    if op == "varlen_attention":
        return (rnd(T, heads, head_dim), rnd(T, heads, head_dim), rnd(T, heads, head_dim), cu, max_len), {}
    if op == "varlen_attention_rope":
        qkv = (rnd(T, heads, head_dim), rnd(T, heads, head_dim), rnd(T, heads, head_dim))
        return (*qkv, cu, max_len, cos, sin), {}
    if op == "lora_linear":
        w = rnd(d + 8, d, grad=False, scale=d**-0.5)  # unit-scale outputs, as in a real layer
        return (rnd(T, d), w, rnd(d + 8, grad=False), rnd(4, d, scale=d**-0.5), rnd(d + 8, 4), 0.5), {}
    raise KeyError(op)


def backend_fn(op: str, backend: str):
    module = importlib.import_module(f"kohakumoss_kernels.ops.{_OPS[op]}.{backend}")
    return getattr(module, op)


def _grad_leaves(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def run(fn, args, kwargs, seed: int = 1):
    """Outputs and input gradients of fn on detached copies; output gradients are seeded randoms."""
    args = tuple(
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    )
    leaves = _grad_leaves(args)
    for leaf in leaves:  # poison: a gradient the kernel forgets to write shows up as NaN
        leaf.grad = None
    out = fn(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves]


def shuffle_samples(args: tuple, seed: int = 3) -> tuple:
    """The same inputs with token_sample (the long tensor) permuted: rows not grouped by sample."""
    g = torch.Generator().manual_seed(seed)

    def one(a):
        if isinstance(a, torch.Tensor) and a.dtype == torch.long:
            return a[torch.randperm(a.numel(), generator=g).to(a.device)]
        return a

    return tuple(one(a) for a in args)


def compare_shuffled(op: str, backend: str, lengths: list[int], dtype, device, **dims) -> None:
    compare(op, backend, lengths, dtype, device, shuffle=True, **dims)


_FORWARD_ACC = sample_sums.forward_acc


def _poisoned_forward_acc(*args, **kwargs):
    """sample_sums.forward_acc with its buffer NaN until the op's forward kernel zeroes it."""
    acc, kernel_args = _FORWARD_ACC(*args, **kwargs)
    if acc is not None:
        acc.fill_(float("nan"))
    return acc, kernel_args


def compare(
    op: str, backend: str, lengths: list[int], dtype, device, shuffle: bool = False, op_kwargs=None, **dims
) -> None:
    """Assert backend == eager (computed in float32 from the same inputs) on outputs and gradients;
    op_kwargs go to both calls (for example norm_modulate's fork=True)."""
    args, kwargs = make_inputs(op, lengths, dtype, device, **dims)
    kwargs = {**kwargs, **(op_kwargs or {})}
    if shuffle:
        args = shuffle_samples(args)
    ref_args = tuple(
        a.detach().float().requires_grad_(a.requires_grad)
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float32
        else a
        for a in args
    )
    ref_out, ref_grads = run(eager_op(op), ref_args, kwargs)
    with torch.no_grad():  # poison the allocator: fresh outputs must not inherit a correct answer
        for o in ref_out:
            torch.full_like(o, float("nan"), dtype=dtype)
    with mock.patch.object(sample_sums, "forward_acc", _poisoned_forward_acc):
        out, grads = run(backend_fn(op, backend), args, kwargs)
    atol, rtol = TOL[dtype]
    for i, (a, b) in enumerate(zip(out, ref_out)):
        assert a.dtype == dtype, f"{op}/{backend}: output {i} dtype {a.dtype}"
        torch.testing.assert_close(
            a.float(), b.float(), atol=atol, rtol=rtol, msg=lambda m, i=i: f"{op} out{i}: {m}"
        )
    assert len(grads) == len(ref_grads)
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        assert a is not None, f"{op}/{backend}: grad {i} missing"
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(
            a.float() / scale,
            b.float() / scale,
            atol=atol,
            rtol=rtol,
            msg=lambda m, i=i: f"{op} grad{i}: {m}",
        )


def backward_twice(op: str, backend: str, lengths: list[int], dtype, device, **dims) -> None:
    """Two backwards through one retained graph give the same input gradients (the per-sample ops hand
    their forward's zeroed sums buffer to the first backward only)."""
    args, kwargs = make_inputs(op, lengths, dtype, device, **dims)
    args = tuple(
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    )
    leaves = _grad_leaves(args)
    out = backend_fn(op, backend)(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    seeds = [torch.ones_like(o) for o in outs]
    first = torch.autograd.grad(outs, leaves, seeds, retain_graph=True)
    second = torch.autograd.grad(outs, leaves, seeds)
    for i, (a, b) in enumerate(zip(first, second)):
        torch.testing.assert_close(a, b, msg=lambda m, i=i: f"{op} grad{i}, second backward: {m}")
