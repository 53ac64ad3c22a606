"""Per-op kernel benchmark at the moss-image-5b block shape (1 MP, two samples packed), plus one block.

    python scripts/bench/bench_kernels.py
    kogine run scripts/bench/bench_kernels.py [--set SAMPLES=2 ...]

For each op: eager, torch.compile, the Triton kernel (and for attention torch's own candidates and
SDPA flash on the padded equal-length batch), forward and forward + backward, as ms and as achieved
GB/s (memory-bound ops) or TFLOP/s (attention) against ceilings measured here (device copy
bandwidth, bf16 matmul rate). Then the block's LoRA linears (each lora_linear / lora_group backend against
the frozen GEMMs alone: what the adapter adds, and its floor at copy bandwidth), and a synthetic block
with LoRA r32 on its linears through the registry vs eager vs torch.compile. Prints a table last; writes kernels_bench.json under $OUT.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kohakumoss_common.timing import copy_gbs, median_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kohakumoss_kernels import OpSet, registry  # noqa: E402
from kohakumoss_kernels.backends import triton_utils  # noqa: E402
from kohakumoss_kernels.runtime import grad_sink  # noqa: E402

D_MODEL = 3072
HEADS = 24
HEAD_DIM = 128
MLP_HIDDEN = 8192  # fused [hidden | gate] projection width 2 * 8192
IMAGE_TOKENS = 4096
TEXT_TOKENS = 256
SAMPLES = 2
LORA_RANK = 32
DTYPE = "bfloat16"
WARMUP = 3
ITERS = 20
GRAPH_REPS = 10  # calls captured back to back in one CUDA graph: the graph's launch latency spread over them
OPS = (  # a row op with the suffix _frozen: its parameters need no gradient (as in LoRA training)
    "rms_norm,norm_modulate,norm_modulate_fork,norm_modulate_frozen,norm_modulate_fork_frozen,gated_residual,"
    "residual_norm_modulate,apply_rope,qk_norm_rope,qk_norm_rope_frozen,situ_glu,varlen_attention"
)
BACKENDS = "eager,compile,triton"  # per op (attention adds ATTN_BACKENDS)
ATTN_BACKENDS = "triton,sdpa_groups,torch_varlen,flex"
# caption tokens per sample, e.g. "40,90": the attention rows take the trainer's layout (SAMPLES images of
# IMAGE_TOKENS, each with its caption, a pad segment to a multiple of TEXT_PAD:
# kohakumoss.model.seq.PackedSeq.build); "": SAMPLES runs of IMAGE_TOKENS + TEXT_TOKENS
ATTN_CAPTIONS = ""
BLOCK = True
LORA = True  # the LoRA linears at the block's shapes: each backend against the frozen GEMMs alone
LORA_BACKENDS = "eager,compile,triton,addmm,addmm_lora_first,addmm_lowrank"
LORA_SINK = True  # as the step: fp32 adapter weights, their gradients added into .grad (grad_sink)
HOST_SYNC = (
    "eager",
    "compile",
    "sdpa_groups",
    "flex",
)  # attention backends that read cu_seqlens on the host
DEVICE = "cuda"


def time_ms(fn, warmup: int = WARMUP, iters: int = ITERS) -> float:
    return median_ms(fn, warmup, iters)


def time_graph_ms(fn, iters: int = ITERS, reps: int | None = None) -> float | None:
    """GPU time per call from replays of a CUDA graph of `reps` calls back to back (no Python, and the
    graph's launch latency, which a timed replay waits through, spread over the calls, as in the graphed
    training step); None if fn cannot be captured."""
    reps = GRAPH_REPS if reps is None else reps
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
    except Exception as e:  # a host sync (eager attention's .tolist()) cannot be captured
        print(f"graph capture failed, timing per call: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.synchronize()
        return None
    return time_ms(graph.replay, 2, iters) / reps


def ceilings() -> dict[str, float]:
    copy = copy_gbs(DEVICE, gib=2.0)  # its 4 GiB are freed before the matmul
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    mm_ms = time_ms(lambda: a @ b, 3, 10)
    return {"copy_GBps": copy, "bf16_mm_TFLOPs": 2 * 8192**3 / mm_ms / 1e9}


FROZEN = "_frozen"  # an op name's suffix: its parameters need no gradient (LoRA training's AdaLN, q/k norms)
LORA_OPS = ("lora_linear", "lora_group")  # the registry's ops benched in their own section (LORA), not per op
FORK_OPS = ("norm_modulate",)  # ops with a fork=True form (the row name's `_fork`)


def base_op(op: str) -> tuple[str, bool, bool]:
    """(the registry's op, fork, frozen) of a benchmark row's op name: `norm_modulate_fork_frozen` is
    norm_modulate with fork=True and its shift / scale frozen."""
    frozen = op.endswith(FROZEN)
    op = op.removesuffix(FROZEN)
    return op.removesuffix("_fork"), op.endswith("_fork"), frozen


def check_ops(text: str) -> list[str]:
    """OPS as a list, every name known (a row op may carry the `_frozen` suffix), before any timing."""
    known = [op for op in registry.available_ops() if op not in LORA_OPS]
    ops = [op.strip() for op in text.split(",") if op.strip()]
    for op in ops:
        name, fork, frozen = base_op(op)
        if (
            name not in known
            or (fork and name not in FORK_OPS)
            or (frozen and name.startswith("varlen_attention"))
        ):
            raise SystemExit(
                f"OPS: unknown op '{op}'; known: {', '.join(known)}, {', '.join(f + '_fork' for f in FORK_OPS)} "
                f"(row ops also with the suffix {FROZEN})"
            )
    return ops


def inputs(op: str, dtype, g):
    """(args, bytes forward, bytes backward) of a row. A `_frozen` row's parameters (every tensor not
    of the tokens' length: AdaLN rows, norm weights) need no gradient, so the backward skips their sums."""
    name, fork, frozen = base_op(op)
    args, bytes_f, bytes_b = _inputs(name + ("_fork" if fork else ""), dtype, g)
    if frozen:
        T = SAMPLES * (IMAGE_TOKENS + TEXT_TOKENS)
        args = tuple(a.detach() if isinstance(a, torch.Tensor) and a.shape[0] != T else a for a in args)
    return args, bytes_f, bytes_b


def _inputs(op: str, dtype, g):
    T = SAMPLES * (IMAGE_TOKENS + TEXT_TOKENS)
    L = IMAGE_TOKENS + TEXT_TOKENS
    d, B = D_MODEL, SAMPLES

    def rnd(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, device=DEVICE, generator=g) * scale).to(dt).requires_grad_(True)

    def folded(*shape):  # the AdaLN scale as the model passes it: the norm weight folded in, float32
        return rnd(*shape, scale=0.1, dt=torch.float32)

    ts = torch.arange(B, device=DEVICE).repeat_interleave(L)
    cu = torch.arange(B + 1, device=DEVICE, dtype=torch.int32) * L
    ang = torch.rand(T, HEAD_DIM // 2, device=DEVICE, generator=g) * 6.28
    cos, sin = ang.cos(), ang.sin()
    e = 2  # bytes per element
    rows = T * d * e
    heads = T * HEADS * HEAD_DIM * e
    table = {  # op: (args, bytes forward, bytes backward)
        "rms_norm": ((rnd(T, d), rnd(d), 1e-6), 2 * rows, 3 * rows),
        "norm_modulate": (
            (rnd(T, d), rnd(B, d, scale=0.1), folded(B, d), ts, 1e-6),
            2 * rows,
            3 * rows,
        ),
        # as the model's block: x also returned for the residual, whose gradient the backward adds
        "norm_modulate_fork": (
            (rnd(T, d), rnd(B, d, scale=0.1), folded(B, d), ts, 1e-6),
            2 * rows,
            4 * rows,
        ),
        "gated_residual": ((rnd(T, d), rnd(T, d), rnd(B, d), ts), 3 * rows, 3 * rows),
        "residual_norm_modulate": (
            (rnd(T, d), rnd(T, d), rnd(B, d), rnd(B, d, scale=0.1), folded(B, d), ts, 1e-6),
            4 * rows,
            6 * rows,
        ),
        "apply_rope": ((rnd(T, HEADS, HEAD_DIM), cos, sin), 2 * heads, 2 * heads),
        "qk_norm_rope": ((rnd(T, HEADS, HEAD_DIM), rnd(HEAD_DIM), cos, sin, 1e-6), 2 * heads, 3 * heads),
        "situ_glu": ((rnd(T, 2 * MLP_HIDDEN),), 3 * T * MLP_HIDDEN * e, 5 * T * MLP_HIDDEN * e),
        "varlen_attention": (attention_inputs(rnd, cu, L), None, None),
    }
    return table[op]


def attention_lengths() -> list[int]:
    """Each attended run's length: the samples' (and the pad segment's, in the trainer's layout)."""
    if not ATTN_CAPTIONS:
        return [IMAGE_TOKENS + TEXT_TOKENS] * SAMPLES
    seq = trainer_layout()
    return [b - a for a, b in zip(seq.cu_seqlens.tolist()[:-1], seq.cu_seqlens.tolist()[1:])]


@functools.cache
def trainer_layout():
    """The PackedSeq the trainer builds for captions of ATTN_CAPTIONS tokens (square images)."""
    from kohakumoss.model.seq import PackedSeq
    from kohakumoss.train.graphs import TEXT_PAD

    side = math.isqrt(IMAGE_TOKENS)
    captions = [int(n) for n in ATTN_CAPTIONS.split(",")]
    return PackedSeq.build(captions, [(side, side)] * len(captions), DEVICE, pad_to=TEXT_PAD)


def attention_flops() -> float:
    return 4.0 * sum(n * n for n in attention_lengths()) * HEADS * HEAD_DIM


def fwd_bwd(fn, args):
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def fwd():
        with torch.no_grad():
            fn(*args)

    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    cpu = torch.Generator().manual_seed(0)  # the CUDA generator may be left mid-capture by a failed graph
    grads = [torch.randn(o.shape, generator=cpu).to(o.device, o.dtype) for o in outs]
    del out, outs

    def both():  # gradients returned, not accumulated: a leaf's .grad would copy a pass-through gradient
        o = fn(*args)
        torch.autograd.grad(o if isinstance(o, tuple) else (o,), leaves, grads)

    return fwd, both


def attention_inputs(rnd, cu, L) -> tuple:
    """q, k, v, cu_seqlens, max_seqlen of the attention rows (ATTN_CAPTIONS: the trainer's layout)."""
    if not ATTN_CAPTIONS:
        return (*(rnd(SAMPLES * L, HEADS, HEAD_DIM) for _ in range(3)), cu, L)
    seq = trainer_layout()
    T = int(seq.cu_seqlens[-1])
    return (*(rnd(T, HEADS, HEAD_DIM) for _ in range(3)), seq.cu_seqlens, seq.max_seqlen)


def bench_op(op: str, dtype, ceil: dict, rows: list[dict]) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(0)
    args, bytes_f, bytes_b = inputs(op, dtype, g)
    backends = BACKENDS.split(",")
    if op == "varlen_attention":
        backends = [b for b in backends if b != "triton"] + ATTN_BACKENDS.split(",")
    for backend in backends:
        row = {"op": op, "backend": backend}
        try:
            if backend == "eager":
                fn = registry.eager_op(base_op(op)[0])
            else:
                fn = registry.load_backend(base_op(op)[0], backend, "sm90", dtype)
            if fn is None:
                raise RuntimeError("backend unavailable")
            if base_op(op)[1]:
                fn = functools.partial(fn, fork=True)
            fwd, both = fwd_bwd(fn, args)
            row["call_fwd_ms"] = time_ms(fwd)
            row["call_fwd_bwd_ms"] = time_ms(both)
            graph_fwd = graph_both = None
            if not (op.startswith("varlen_attention") and backend in HOST_SYNC):
                graph_fwd, graph_both = time_graph_ms(fwd), time_graph_ms(both)
            row["timing"] = "cuda graph" if graph_fwd and graph_both else "per call"
            row["fwd_ms"] = graph_fwd or row["call_fwd_ms"]
            row["fwd_bwd_ms"] = graph_both or row["call_fwd_bwd_ms"]
        except Exception as e:  # a failing backend is a row of the table, not the end of the run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            traceback.print_exc()
        add_rates(row, op, bytes_f, bytes_b, ceil)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if op == "varlen_attention" and not ATTN_CAPTIONS:
        rows.append(padded_sdpa(args, dtype, ceil))
        print(json.dumps(rows[-1]), flush=True)


@functools.cache
def copy_ms(nbytes: int) -> float:
    """A device copy moving `nbytes` (half read, half written), CUDA-graph timed as the ops are: the rate
    a kernel of that size gets without any work (its launch ramp and tail included)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return time_graph_ms(lambda: dst.copy_(src))


def add_rates(row: dict, op: str, bytes_f, bytes_b, ceil: dict) -> None:
    if "fwd_ms" not in row:
        return
    if op.startswith("varlen_attention"):
        flops = attention_flops()
        row["fwd_TFLOPs"] = flops / row["fwd_ms"] / 1e9
        row["fwd_bwd_TFLOPs"] = 3.5 * flops / row["fwd_bwd_ms"] / 1e9  # backward = 2.5 x forward matmuls
        row["fwd_pct_ceiling"] = 100 * row["fwd_TFLOPs"] / ceil["bf16_mm_TFLOPs"]
        row["fwd_bwd_pct_ceiling"] = 100 * row["fwd_bwd_TFLOPs"] / ceil["bf16_mm_TFLOPs"]
    else:
        row["fwd_GBps"] = bytes_f / row["fwd_ms"] / 1e6
        row["fwd_bwd_GBps"] = (bytes_f + bytes_b) / row["fwd_bwd_ms"] / 1e6
        row["fwd_pct_ceiling"] = 100 * row["fwd_GBps"] / ceil["copy_GBps"]
        row["fwd_bwd_pct_ceiling"] = 100 * row["fwd_bwd_GBps"] / ceil["copy_GBps"]
        # the same bytes as plain copies (forward, then forward and backward as two): what size alone costs
        row["copy_same_fwd_GBps"] = bytes_f / copy_ms(bytes_f) / 1e6
        row["copy_same_fwd_bwd_GBps"] = (bytes_f + bytes_b) / (copy_ms(bytes_f) + copy_ms(bytes_b)) / 1e6


def padded_sdpa(args, dtype, ceil: dict) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    L = IMAGE_TOKENS + TEXT_TOKENS
    q, k, v = (a.detach().view(SAMPLES, L, HEADS, HEAD_DIM).transpose(1, 2).contiguous() for a in args[:3])
    for t in (q, k, v):
        t.requires_grad_(True)
    row = {"op": "varlen_attention", "backend": f"sdpa_flash_padded[{SAMPLES},{HEADS},{L},{HEAD_DIM}]"}
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd, both = fwd_bwd(F.scaled_dot_product_attention, (q, k, v))
            row["call_fwd_ms"] = time_ms(fwd)
            row["call_fwd_bwd_ms"] = time_ms(both)
            graph_fwd, graph_both = time_graph_ms(fwd), time_graph_ms(both)
            row["timing"] = "cuda graph" if graph_fwd and graph_both else "per call"
            row["fwd_ms"] = graph_fwd or row["call_fwd_ms"]
            row["fwd_bwd_ms"] = graph_both or row["call_fwd_bwd_ms"]
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"
    add_rates(row, "varlen_attention", None, None, ceil)
    return row


# ---- the LoRA linears ------------------------------------------------------------------------


def lora_cases(dtype, g) -> list[tuple[str, str, tuple, float]]:
    """(name, op, args, floor bytes): the block's LoRA linears; floor = the rank-r terms' passes over
    memory at best (forward: read x, read + write y; backward: read gy twice, read x, write + read gx)."""
    T = SAMPLES * (IMAGE_TOKENS + TEXT_TOKENS)
    r, e = LORA_RANK, 2

    def w(o, i, grad=False, scale=None):  # trained ones: the adapter's masters (fp32 with LORA_SINK)
        t = torch.randn(o, i, device=DEVICE, generator=g) * (scale or 1 / math.sqrt(i))
        return t.to(torch.float32 if grad and LORA_SINK else dtype).requires_grad_(grad)

    cases = []
    for name, (o, i) in {"o 3072>3072": (D_MODEL, D_MODEL), "up_gate 3072>16384": (2 * MLP_HIDDEN, D_MODEL),
                         "down 8192>3072": (D_MODEL, MLP_HIDDEN)}.items():  # fmt: skip
        x = (torch.randn(T, i, device=DEVICE, generator=g)).to(dtype).requires_grad_(True)
        args = (x, w(o, i), None, w(r, i, True), w(o, r, True, 0.01), 1.0)
        cases.append((name, "lora_linear", args, T * e * (3 * o + 2 * i + 2 * o + 2 * i)))
    x = (torch.randn(T, D_MODEL, device=DEVICE, generator=g)).to(dtype).requires_grad_(True)
    ws = tuple(w(D_MODEL, D_MODEL) for _ in range(3))
    downs = tuple(w(r, D_MODEL, True) for _ in range(3))
    ups = tuple(w(D_MODEL, r, True, 0.01) for _ in range(3))
    group = (x, ws, (None,) * 3, downs, ups, (1.0,) * 3)
    cases.append(("q,k,v 3x 3072>3072", "lora_group", group, T * e * D_MODEL * (3 * 3 + 2 + 3 * 2 + 2 + 2)))
    return cases


def _group_leaves(args) -> list[torch.Tensor]:
    out = []
    for a in args:
        for t in a if isinstance(a, tuple) else (a,):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                out.append(t)
    return out


def bench_lora(dtype, ceil: dict, rows: list[dict]) -> None:
    """Per backend: graph-replayed forward + backward, and what it adds to the frozen GEMMs alone."""
    g = torch.Generator(device=DEVICE).manual_seed(2)
    for name, op, args, floor in lora_cases(dtype, g):
        ws = args[1] if op == "lora_group" else (args[1],)
        x = args[0]

        def base(x=x, ws=ws):  # forward and input gradient of the frozen GEMMs, no adapter
            outs = [x @ wi.t() for wi in ws]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            x.grad = None

        base_ms = time_graph_ms(base)
        leaves = [t for t in _group_leaves(args) if t is not x]
        sunk = leaves if LORA_SINK else []
        for leaf in sunk:  # the step's fixed gradient buffers, which the ops accumulate into
            leaf.grad = torch.zeros_like(leaf)
        for backend in LORA_BACKENDS.split(","):
            row = {"op": f"{op} {name}", "backend": backend, "base_fwd_bwd_ms": base_ms}
            try:
                fn = (
                    registry.eager_op(op)
                    if backend == "eager"
                    else registry.load_backend(op, backend, "sm90", dtype)
                )
                if fn is None:
                    raise RuntimeError("backend unavailable")

                def both(fn=fn, args=args, x=x, leaves=leaves, sunk=sunk):
                    with grad_sink.into(sunk):
                        out = fn(*args)
                        outs = out if isinstance(out, tuple) else (out,)
                        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
                    x.grad = None
                    if not sunk:
                        for leaf in leaves:
                            leaf.grad = None

                row["fwd_bwd_ms"] = time_graph_ms(both)
                if row["fwd_bwd_ms"] and base_ms:
                    row["lora_extra_ms"] = row["fwd_bwd_ms"] - base_ms
                    row["lora_floor_ms"] = floor / ceil["copy_GBps"] / 1e6
            except Exception as e:  # a failing backend is a row of the table, not the end of the run
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)


def lora_table(rows: list[dict]) -> str:
    lines = ["| linear | backend | fwd+bwd ms | frozen GEMMs ms | LoRA extra ms | extra at copy bandwidth ms |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        if "base_fwd_bwd_ms" not in r:
            continue
        f = lambda k, r=r: f"{r[k]:.3f}" if isinstance(r.get(k), float) else "-"  # noqa: E731
        lines.append(
            f"| {r['op']} | {r['backend']} | {f('fwd_bwd_ms')} | {f('base_fwd_bwd_ms')} | {f('lora_extra_ms')} | "
            f"{f('lora_floor_ms')} |" + (f" {r['error']}" if r.get("error") else "")
        )
    return "\n".join(lines)


# ---- the block -------------------------------------------------------------------------------


def eager_namespace() -> SimpleNamespace:
    """The eager ops as attributes, for the torch.compile baseline (no registry in the graph)."""
    return SimpleNamespace(**{op: registry.eager_op(op) for op in registry.available_ops()})


def block_params(dtype, g):
    d, r = D_MODEL, LORA_RANK

    def w(o, i, grad=False, scale=None):
        t = torch.randn(o, i, device=DEVICE, generator=g) * (scale or 1 / math.sqrt(i))
        return t.to(dtype).requires_grad_(grad)

    shapes = {
        "q": (d, d),
        "k": (d, d),
        "v": (d, d),
        "o": (d, d),
        "up_gate": (2 * MLP_HIDDEN, d),
        "down": (d, MLP_HIDDEN),
    }
    p = {}
    for name, (o, i) in shapes.items():
        p[name] = w(o, i)
        p[name + ".down"] = w(r, i, grad=True)
        p[name + ".up"] = w(o, r, grad=True, scale=0.01)
    p["q_norm"] = torch.ones(HEAD_DIM, device=DEVICE, dtype=dtype)
    p["k_norm"] = torch.ones(HEAD_DIM, device=DEVICE, dtype=dtype)
    return p


def block(ops, p, x, mod, ts, cu, max_len, cos, sin):
    """norm_modulate -> q, k, v (one lora_group, as the model's attention) -> qk-norm + rope -> attention
    -> o -> gated residual + norm_modulate -> up_gate -> situ_glu -> down -> gated residual; every linear
    frozen with its own LoRA r32 bypass. The scales come in float32 (the model folds the norm weights in)."""
    T, d = x.shape
    s = 1.0

    def lin(h, name):
        return ops.lora_linear(h, p[name], None, p[name + ".down"], p[name + ".up"], s)

    shift1, scale1, gate1, shift2, scale2, gate2 = mod
    h, x = ops.norm_modulate(x, shift1, scale1, ts, 1e-6, fork=True)  # as the model's block
    names = ("q", "k", "v")
    qkv = ops.lora_group(
        h, tuple(p[n] for n in names), (None,) * 3, tuple(p[n + ".down"] for n in names),
        tuple(p[n + ".up"] for n in names), (s,) * 3,
    )  # fmt: skip
    q, k, v = (t.view(T, HEADS, HEAD_DIM) for t in qkv)
    q = ops.qk_norm_rope(q, p["q_norm"], cos, sin, 1e-6)
    k = ops.qk_norm_rope(k, p["k_norm"], cos, sin, 1e-6)
    a = ops.varlen_attention(q, k, v, cu, max_len)
    x, h = ops.residual_norm_modulate(x, lin(a.reshape(T, d), "o"), gate1, shift2, scale2, ts, 1e-6)
    y = lin(ops.situ_glu(lin(h, "up_gate")), "down")
    return ops.gated_residual(x, y, gate2, ts)


def block_flops() -> float:
    T = SAMPLES * (IMAGE_TOKENS + TEXT_TOKENS)
    d = D_MODEL
    linear = 2 * T * d * (3 * d + d + 2 * MLP_HIDDEN) + 2 * T * MLP_HIDDEN * d
    return linear + attention_flops()


def bench_block(dtype, rows: list[dict]) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(1)
    T = SAMPLES * (IMAGE_TOKENS + TEXT_TOKENS)
    L = IMAGE_TOKENS + TEXT_TOKENS
    p = block_params(dtype, g)
    x = (torch.randn(T, D_MODEL, device=DEVICE, generator=g)).to(dtype).requires_grad_(True)
    mod = [
        (torch.randn(SAMPLES, D_MODEL, device=DEVICE, generator=g) * 0.1)
        .to(torch.float32 if i in (1, 4) else dtype)
        .requires_grad_(True)
        for i in range(6)
    ]  # trained (it comes from the timestep MLP); the scales in float32, the norm weights folded in
    ts = torch.arange(SAMPLES, device=DEVICE).repeat_interleave(L)
    cu = torch.arange(SAMPLES + 1, device=DEVICE, dtype=torch.int32) * L
    ang = torch.rand(T, HEAD_DIM // 2, device=DEVICE, generator=g) * 6.28
    cos, sin = ang.cos(), ang.sin()
    extra = (x, mod, ts, cu, L, cos, sin)
    # fwd + bwd FLOPs: forward linears + attention, backward 2x linears + 2.5x attention
    flops = 3 * (block_flops() - attention_flops()) + 3.5 * attention_flops()

    auto = OpSet("auto", tune="table")
    with auto.tuning():  # the prewarm step: time every candidate once per shape key, keep the winner
        block(auto, p, *extra).float().sum().backward()
    eager_ns = eager_namespace()
    compiled = torch.compile(lambda *a: block(eager_ns, p, *a))
    variants = {
        "eager": lambda *a: block(OpSet("eager"), p, *a),
        "torch.compile": compiled,
        "registry(auto, tuned)": lambda *a: block(auto, p, *a),
        "registry(auto, tune=off)": lambda *a: block(OpSet("auto", tune="off"), p, *a),
    }
    leaves = [x, *mod] + [t for t in p.values() if t.requires_grad]
    grad = torch.randn(T, D_MODEL, device=DEVICE, dtype=dtype)
    for name, fn in variants.items():
        row = {"op": "block(fwd+bwd, LoRA r32)", "backend": name}

        def step(fn=fn):
            fn(*extra).backward(grad)
            for leaf in leaves:
                leaf.grad = None

        try:
            row["fwd_bwd_ms"] = time_ms(step, warmup=3, iters=10)
            row["fwd_bwd_TFLOPs"] = flops / row["fwd_bwd_ms"] / 1e9
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    rows.append({"op": "block", "backend": "chosen", "chosen": auto.chosen()})
    print(json.dumps(rows[-1]), flush=True)


def bandwidth_table(rows: list[dict], ceil: dict) -> str:
    """The memory-bound ops: GB/s and % of the measured copy bandwidth, forward and forward + backward."""
    target = 0.8 * ceil["copy_GBps"]
    head = (
        f"{'op':<24} {'backend':<8} {'fwd GB/s':>9} {'fwd %copy':>9} {'f+b GB/s':>9} {'f+b %copy':>9}  "
        f"{'80% target (fwd / f+b)':<22}  {'same-size copy GB/s f / f+b':>27}  {'% of it f / f+b':>15}"
    )
    lines = [f"copy ceiling {ceil['copy_GBps']:.0f} GB/s; 80% = {target:.0f} GB/s", head, "-" * len(head)]
    for r in rows:
        if "fwd_GBps" not in r:
            continue
        met = " / ".join("met" if r[k] >= target else "not met" for k in ("fwd_GBps", "fwd_bwd_GBps"))
        same = ""
        if "copy_same_fwd_GBps" in r:
            cf, cb = r["copy_same_fwd_GBps"], r["copy_same_fwd_bwd_GBps"]
            pf, pb = 100 * r["fwd_GBps"] / cf, 100 * r["fwd_bwd_GBps"] / cb
            same = f"{cf:13.0f} / {cb:11.0f}  {pf:7.0f} / {pb:5.0f}"
        lines.append(
            f"{r['op']:<24} {r['backend']:<8} {r['fwd_GBps']:9.0f} {r['fwd_pct_ceiling']:9.0f} "
            f"{r['fwd_bwd_GBps']:9.0f} {r['fwd_bwd_pct_ceiling']:9.0f}  {met:<22}  {same}"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (
        f"{'op':<26} {'backend':<34} {'fwd ms':>8} {'f+b ms':>8} {'fwd rate':>14} {'f+b rate':>14} "
        f"{'%ceil f/fb':>11}  {'timing':<10} {'per-call f / f+b ms':>20}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "chosen" in r or "base_fwd_bwd_ms" in r:  # the LoRA rows have their own table (lora_table)
            continue
        if "error" in r:
            lines.append(f"{r['op']:<26} {r['backend']:<34} {'error: ' + r['error'][:60]}")
            continue
        unit = "TFLOP/s" if "fwd_bwd_TFLOPs" in r else "GB/s"
        key = "TFLOPs" if unit == "TFLOP/s" else "GBps"
        fwd = f"{r['fwd_ms']:8.3f}" if "fwd_ms" in r else f"{'':8}"
        rf = f"{r[f'fwd_{key}']:7.0f} {unit}" if f"fwd_{key}" in r else ""
        rb = f"{r[f'fwd_bwd_{key}']:7.0f} {unit}"
        pct = f"{r['fwd_pct_ceiling']:4.0f}/{r['fwd_bwd_pct_ceiling']:4.0f}" if "fwd_pct_ceiling" in r else ""
        lines.append(
            f"{r['op']:<26} {r['backend']:<34} {fwd} {r['fwd_bwd_ms']:8.3f} {rf:>14} {rb:>14} {pct:>11}"
        )
    return "\n".join(lines)


def main() -> None:
    check_ops(OPS)
    if ATTN_CAPTIONS and BLOCK:
        raise SystemExit("ATTN_CAPTIONS times the attention rows alone: set BLOCK=False")
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    dtype = getattr(torch, DTYPE)
    ceil = ceilings()
    print(
        json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, **ceil}), flush=True
    )
    rows: list[dict] = []
    for op in check_ops(OPS):
        bench_op(op, dtype, ceil, rows)
        torch.cuda.empty_cache()
    if LORA:
        bench_lora(dtype, ceil, rows)
        torch.cuda.empty_cache()
    if BLOCK:
        try:
            bench_block(dtype, rows)
        except Exception:
            traceback.print_exc()
    import triton

    print(
        f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  {DTYPE}  "
        f"T={SAMPLES}x({IMAGE_TOKENS}+{TEXT_TOKENS})  d={D_MODEL} H={HEADS} D={HEAD_DIM}  "
        f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s"
    )
    print(table(rows))
    print()
    print(bandwidth_table(rows, ceil))
    if LORA:
        print()
        print(lora_table(rows))
    configs = triton_utils.picked()  # the launch configs the Triton row kernels chose, per width and size
    print("\nTriton launch configs picked (rows per tile, num_warps):")
    for key, cfg in configs.items():
        print(f"  {key}: {cfg}")
    if out := os.environ.get("OUT"):
        Path(out, "kernels_bench.json").write_text(
            json.dumps(
                {"ceilings": ceil, "rows": rows, "launch_configs": triton_utils.picked(with_times=True)},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
