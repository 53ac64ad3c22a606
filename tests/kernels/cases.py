"""Random inputs per op and the comparison against eager, shared by the GPU tests and the interpreter run."""

from __future__ import annotations

from unittest import mock

import torch

from kohakumoss_kernels.backends import sample_sums
from kohakumoss_kernels.ops.norm_modulate import eager as norm_modulate_eager
from kohakumoss_kernels.ops.rms_norm import eager as rms_norm_eager
from kohakumoss_kernels.registry import backend_fn, eager_op

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
    spread: float = 1.0,
) -> tuple[tuple, dict]:
    """(args, kwargs) for one call of `op`; float tensors that take gradients require them. frozen: the
    norm weights and per-sample AdaLN parameters do not (LoRA training), so the backwards skip them.
    spread: the standard deviation of situ_glu's input."""
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
    if op == "situ_glu":  # [hidden | gate]; a spread of 30-100 reaches the soft caps
        return (rnd(T, 2 * d, scale=spread),), {}
    if op == "varlen_attention":
        return (rnd(T, heads, head_dim), rnd(T, heads, head_dim), rnd(T, heads, head_dim), cu, max_len), {}
    if op == "segment_attention":  # the reference-image layout: per sample [live n, refs n // 2] queries
        q_lens = [n for length in lengths for n in (length, length // 2)]
        kv_lens = [n for length in lengths for n in (length + length // 2, length // 2)]
        cu_q, _, _ = cu_seqlens(q_lens, device)
        cu_kv, _, _ = cu_seqlens(kv_lens, device)
        Tq, Tk = sum(q_lens), sum(kv_lens)
        qkv = (rnd(Tq, heads, head_dim), rnd(Tk, heads, head_dim), rnd(Tk, heads, head_dim))
        return (*qkv, cu_q, cu_kv, max(q_lens), max(kv_lens)), {}
    if op == "lora_linear":
        w = rnd(d + 8, d, grad=False, scale=d**-0.5)  # unit-scale outputs, as in a real layer
        return (rnd(T, d), w, rnd(d + 8, grad=False), rnd(4, d, scale=d**-0.5), rnd(d + 8, 4), 0.5), {}
    raise KeyError(op)


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


def with_reference_row(op: str, args: tuple, seed: int = 4) -> tuple:
    """The edit layout's modulation: each per-sample parameter gains a row B (the t = 0 one), and about a
    third of the tokens, in runs between the samples' own, read it (model/seq.py)."""
    rows = PER_SAMPLE_PARAMS[op].values()
    args = list(args)
    for i in rows:
        extra = torch.randn((1, args[i].shape[1]), generator=torch.Generator().manual_seed(seed + i))
        args[i] = torch.cat([args[i].detach(), extra.to(args[i])]).requires_grad_(args[i].requires_grad)
    B = args[next(iter(rows))].shape[0] - 1
    ts = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype == torch.long)
    token_sample = args[ts].clone()
    token_sample[(torch.arange(token_sample.numel(), device=token_sample.device) // 4) % 3 == 2] = B
    args[ts] = token_sample
    return tuple(args)


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
    op: str,
    backend: str,
    lengths: list[int],
    dtype,
    device,
    shuffle: bool = False,
    op_kwargs=None,
    reference_row: bool = False,
    **dims,
) -> None:
    """Assert backend == eager (computed in float32 from the same inputs) on outputs and gradients;
    op_kwargs go to both calls (for example norm_modulate's fork=True); reference_row: the AdaLN ops'
    edit layout (`with_reference_row`)."""
    args, kwargs = make_inputs(op, lengths, dtype, device, **dims)
    kwargs = {**kwargs, **(op_kwargs or {})}
    if shuffle:
        args = shuffle_samples(args)
    if reference_row:
        args = with_reference_row(op, args)
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


# The per-sample parameters' positions in the AdaLN ops' arguments.
PER_SAMPLE_PARAMS = {
    "norm_modulate": {"shift": 1, "scale": 2},
    "residual_norm_modulate": {"gate": 2, "shift": 3, "scale": 4},
    "gated_residual": {"gate": 2},
}
# Per dtype of the compared tensor, after dividing by max(1, |reference|): a 16-bit one within a few of its
# ulps (two float32 computations rounded once each), a float32 one tight, so a float32 parameter gradient
# that passed through a 16-bit buffer (2^-9 relative) fails.
MIXED_TOL = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def mixed_inputs(
    op: str, lengths: list[int], dtype, device, scale_dtype, trained: tuple[str, ...], d: int = 40
) -> tuple[tuple, dict]:
    """make_inputs' tensors in `dtype` except the modulation's scale, in `scale_dtype` (the model folds the
    norm weight into it in float32, so it is not rounded to `dtype`); of the per-sample parameters only
    those named in `trained` require a gradient. The others are quarters in [-2, 2], so x + gate * y is
    exact in bf16: the interpreter truncates float32 to bf16 where the GPU rounds to nearest."""
    args, kwargs = make_inputs(op, lengths, torch.float32, device, d=d)
    names = {i: n for n, i in PER_SAMPLE_PARAMS[op].items()}
    out = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            if names.get(i) == "scale":
                a = a.detach().to(scale_dtype)
            else:
                a = (a.detach() * 4).round().clamp(-8, 8).div(4).to(dtype)
            a.requires_grad_(names[i] in trained if i in names else True)
        out.append(a)
    return tuple(out), kwargs


def _rms_norm_f32(x: torch.Tensor, weight=None, eps: float = 1e-6) -> torch.Tensor:
    return rms_norm_eager.rms_norm(x.float(), weight, eps)


def compare_mixed(
    op: str,
    backend: str,
    lengths: list[int],
    dtype,
    device,
    scale_dtype,
    trained: tuple[str, ...],
    op_kwargs=None,
    d: int = 40,
    tol: dict | None = None,
) -> None:
    """Assert backend == eager on the same inputs of mixed dtypes (`mixed_inputs`): each output in the
    eager op's dtype, each gradient in its input's dtype. Against the eager op within MIXED_TOL of the
    compute dtype; and, each tensor within MIXED_TOL of its own dtype, against the eager op with the
    normalised rows kept in float32 as the kernels keep them (the eager op rounds them to x's dtype
    first, the released rounding order: a 2^-9 that would hide a float32 gradient taken through bf16)."""
    tol = {**MIXED_TOL, **(tol or {})}
    args, kwargs = mixed_inputs(op, lengths, dtype, device, scale_dtype, trained, d=d)
    kwargs = {**kwargs, **(op_kwargs or {})}
    leaves = _grad_leaves(args)
    ref_out, ref_grads = run(eager_op(op), args, kwargs)
    with mock.patch.object(norm_modulate_eager, "rms_norm", _rms_norm_f32):
        f32_out, f32_grads = run(eager_op(op), args, kwargs)
    with mock.patch.object(sample_sums, "forward_acc", _poisoned_forward_acc):
        out, grads = run(backend_fn(op, backend), args, kwargs)
    assert len(out) == len(ref_out) and len(grads) == len(ref_grads) == len(leaves)
    case = f"{op}/{backend} ({dtype}, scale {scale_dtype}, trained {trained})"
    pairs = [(f"out{i}", *abc, abc[1].dtype) for i, abc in enumerate(zip(out, ref_out, f32_out))]
    pairs += [
        (f"grad{i}", a, b, c, leaf.dtype)
        for i, (a, b, c, leaf) in enumerate(zip(grads, ref_grads, f32_grads, leaves))
    ]
    for name, a, b, c, want in pairs:
        assert a is not None, f"{case}: {name} missing"
        assert a.dtype == want == b.dtype, f"{case}: {name} is {a.dtype}, expected {want}"
        for ref, t, which in ((b, tol[dtype], "eager"), (c, tol[want], "eager, float32 rows")):
            scale = max(1.0, ref.abs().max().item())
            torch.testing.assert_close(
                a.float() / scale,
                ref.float() / scale,
                atol=t,
                rtol=t,
                msg=lambda m, n=name, w=which: f"{case} {n} against {w}: {m}",
            )
