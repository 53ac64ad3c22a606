"""Frozen-linear products per storage: bf16 against int8 weight-only, int8 compute (torch._int_mm), the
same ConvRot-rotated, fp8 (row-wise _scaled_mm) and MXFP8 (block-scaled, sm100+ only), at the 5B
block's shapes (3072 -> 3072, 3072 -> 18432). Per row: forward ms, forward + input-gradient ms (a frozen
base's backward), TFLOP/s of the forward, and the forward's relative error against the bf16 product of
the same (dequantized) weight. Each row runs one backend of the `stored_linear` op (what Int8Linear,
Fp8Linear and Mxfp8Linear call), loaded from the registry. Random weights; GPU.

    python scripts/bench/quant_linear.py [--tokens 4096] [--iters 50] [--out quant_linear.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kohakumoss_common.quant import convrot_hadamard  # noqa: E402
from kohakumoss_kernels.registry import load_backend  # noqa: E402
from kohakumoss_kernels.weights import fp8, int8, mxfp8  # noqa: E402

SHAPES = ((3072, 3072), (3072, 18432))
# (row name, weight kind, ConvRot group, stored_linear backend): the op the precision package calls
ROWS = (
    ("int8_weight", "int8", 0, "addmm"),
    ("int8", "int8", 0, "int_mm"),
    ("int8_weight convrot", "int8", 256, "addmm"),
    ("int8 convrot", "int8", 256, "int_mm"),
    ("fp8_weight", "fp8", 0, "addmm"),
    ("fp8", "fp8", 0, "scaled_mm"),
    ("mxfp8", "mxfp8", 0, "block_scaled_mm"),
)


def _time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _weight(kind: str, w: torch.Tensor, group: int):
    if kind == "int8":
        if group:  # as a ConvRot file stores it: rotated per group of input columns, then quantized
            out_f, in_f = w.shape
            w = (w.reshape(out_f, -1, group) @ convrot_hadamard(group, w.device)).reshape(out_f, in_f)
        return int8.Int8Weight(*int8.quantize_weight(w), group=group)
    if kind == "fp8":
        return fp8.Fp8Weight(*fp8.quantize_weight(w))
    return mxfp8.quantize_weight(w)


def _rows(in_f: int, out_f: int, dev) -> list[tuple[str, object, torch.Tensor]]:
    """(name, forward(x) with autograd, the float weight it stands for); backends the card lacks are left out."""
    torch.manual_seed(0)
    w = torch.randn(out_f, in_f, device=dev) * in_f**-0.5
    wb = w.bfloat16()
    rows = [("bf16", lambda x: torch.nn.functional.linear(x, wb), w)]
    major, minor = torch.cuda.get_device_capability(dev)
    for name, kind, group, backend in ROWS:
        fn = load_backend("stored_linear", backend, f"sm{major}{minor}", torch.bfloat16, kind)
        if fn is None:
            print(f"# {name}: stored_linear backend '{backend}' is not bound on sm{major}{minor}")
            continue
        wq = _weight(kind, w, group)
        rows.append(
            (f"{name} ({backend})", lambda x, fn=fn, wq=wq: fn(x, wq, None), wq.dequant(torch.float32))
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default="")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("quant_linear.py needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, T={a.tokens}, random weights")
    print(f"{'shape':>12} {'storage':>20} {'fwd ms':>8} {'fwd+bwd ms':>10} {'TFLOP/s':>8} {'rel err':>9}")
    results = []
    for in_f, out_f in SHAPES:
        x = torch.randn(a.tokens, in_f, device=dev).bfloat16()
        gy = torch.randn(a.tokens, out_f, device=dev).bfloat16()
        for name, fwd, w_ref in _rows(in_f, out_f, dev):
            ref = (x.float() @ w_ref.bfloat16().float().t()).float()
            with torch.no_grad():
                err = float((fwd(x).float() - ref).norm() / ref.norm())
                ms = _time_ms(lambda fwd=fwd, x=x: fwd(x), a.iters)
            xg = x.clone().requires_grad_(True)
            ms_bwd = _time_ms(lambda fwd=fwd, xg=xg, gy=gy: fwd(xg).backward(gy), a.iters)
            tflops = 2 * a.tokens * in_f * out_f / ms / 1e9
            shape = f"{in_f}x{out_f}"
            print(f"{shape:>12} {name:>20} {ms:8.3f} {ms_bwd:10.3f} {tflops:8.1f} {err:9.2e}")
            results.append({"shape": shape, "storage": name, "fwd_ms": ms, "fwd_bwd_ms": ms_bwd,
                            "tflops": tflops, "rel_err": err})  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps({"tokens": a.tokens, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
