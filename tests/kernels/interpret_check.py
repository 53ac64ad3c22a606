"""Run the Triton kernels under TRITON_INTERPRET=1 on tiny fp32 shapes (a subprocess of test_triton_interpret)."""

import os
import sys
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from cases import backward_twice, compare  # noqa: E402

from kohakumoss_kernels.registry import backend_fn, eager_op  # noqa: E402

OPS = sys.argv[1:] or [
    "rms_norm",
    "norm_modulate",
    "gated_residual",
    "residual_norm_modulate",
    "apply_rope",
    "qk_norm_rope",
    "situ_glu",
    "varlen_attention",
]
SMALL = {
    "varlen_attention": {"heads": 2, "head_dim": 16},
}
PER_SAMPLE = ("norm_modulate", "gated_residual", "residual_norm_modulate")


def check_situ_glu() -> None:
    """Widths below, at and above one 1024-column program (not powers of two), inputs whose soft caps
    saturate (|h| ~ 30-100), bf16; near zero, float32's relative precision (2 sigmoid(2x) - 1 would lose
    it); an odd width refused."""
    from kohakumoss_kernels.ops.situ_glu.triton import situ_glu

    for d in (40, 1000, 1500):
        for spread in (1.0, 40.0):
            compare("situ_glu", "triton", [2, 3], torch.float32, "cpu", d=d, spread=spread)
    compare("situ_glu", "triton", [1, 5, 19], torch.float32, "cpu", spread=100.0)
    compare("situ_glu", "triton", [1, 5, 19], torch.bfloat16, "cpu", d=1000, spread=40.0)
    h = torch.randn(7, 600, generator=torch.Generator().manual_seed(2)) * 1e-2
    torch.testing.assert_close(situ_glu(h), eager_op("situ_glu")(h), atol=0.0, rtol=1e-5)
    try:
        situ_glu(torch.randn(2, 5))
    except ValueError as e:
        assert "odd" in str(e), e
    else:
        raise AssertionError("situ_glu took an odd width")


if __name__ == "__main__":
    torch.manual_seed(0)
    for op in OPS:
        compare(op, "triton", [1, 5, 19], torch.float32, "cpu", **SMALL.get(op, {}))
        if op in PER_SAMPLE:  # a sample with no rows, a whole sample inside one chunk, unsorted rows
            compare(op, "triton", [3, 0, 2, 6, 1], torch.float32, "cpu", d=40)
            backward_twice(op, "triton", [3, 0, 2, 6, 1], torch.float32, "cpu", d=40)
            compare(op, "triton", [4, 9, 3], torch.float32, "cpu", shuffle=True, d=40)
            # the edit layout: a t = 0 row B that runs of tokens between the samples' own read
            compare(op, "triton", [4, 9, 3], torch.float32, "cpu", reference_row=True, d=40)
        if op == "norm_modulate":  # x's other use's gradient added in the backward's own pass
            compare(op, "triton", [3, 0, 2, 6, 1], torch.float32, "cpu", op_kwargs={"fork": True}, d=40)
            compare(op, "triton", [3, 0, 2, 6, 1], torch.float32, "cpu", d=32)  # one chunk (row_chunks)
        if op == "situ_glu":
            check_situ_glu()
        if op == "varlen_attention":  # whole 16-row blocks only, and a one-row masked tail after two
            compare(op, "triton", [16, 32, 33], torch.float32, "cpu", **SMALL[op])
        if op in ("rms_norm", "qk_norm_rope"):
            compare(op, "triton", [2], torch.float32, "cpu", d=40, heads=3, head_dim=16)
        if op in (*PER_SAMPLE, "rms_norm", "qk_norm_rope"):  # frozen parameters: their sums skipped
            compare(op, "triton", [3, 0, 2, 6, 1], torch.float32, "cpu", d=40, frozen=True)
        if op == "norm_modulate":
            compare(
                op,
                "triton",
                [3, 0, 2, 6, 1],
                torch.float32,
                "cpu",
                op_kwargs={"fork": True},
                d=40,
                frozen=True,
            )
        print(f"ok {op}", flush=True)
    if not sys.argv[1:]:  # the LoRA linear's rank-r Triton products, alone and inside the op
        from kohakumoss_kernels.ops.lora_linear import lowrank

        g = torch.Generator().manual_seed(0)
        for M, K, r in [(1, 7, 3), (67, 130, 32), (200, 64, 20), (256, 128, 16)]:
            a, w = torch.randn(M, K, generator=g), torch.randn(r, K, generator=g)
            b = torch.randn(M, r, generator=g)
            for rows_cfg, cols_cfg in zip(
                lowrank.ROWS_CONFIGS, lowrank.COLS_CONFIGS * 2
            ):  # each launch shape
                with mock.patch.object(lowrank, "ROWS_CONFIGS", [rows_cfg]):
                    torch.testing.assert_close(lowrank.rows_mm(a, w.t()), a @ w.t(), atol=1e-4, rtol=1e-4)
                with mock.patch.object(lowrank, "COLS_CONFIGS", [cols_cfg]):
                    torch.testing.assert_close(lowrank.mm(a.t(), b), a.t() @ b, atol=1e-4, rtol=1e-4)
            a, w = torch.randn(M, K, generator=g), torch.randn(r, K, generator=g)
            torch.testing.assert_close(lowrank.rows_mm(a, w.t(), 0.5), 0.5 * a @ w.t(), atol=1e-4, rtol=1e-4)
            b = torch.randn(M, r, generator=g)
            torch.testing.assert_close(lowrank.mm(a.t(), b), a.t() @ b, atol=1e-4, rtol=1e-4)
            prior = torch.randn(r, K, generator=g)  # the rank on the left, accumulated into a buffer
            out = prior.clone()
            lowrank.mm_into(out, b.t(), a, 2.0)
            torch.testing.assert_close(out, prior + 2.0 * b.t() @ a, atol=1e-4, rtol=1e-4)
        compare("lora_linear", "addmm_lowrank", [1, 5, 19], torch.float32, "cpu")
        compare("lora_linear", "addmm_lowrank", [70, 3], torch.float32, "cpu", d=40)
        lora_group = backend_fn("lora_group", "addmm_lowrank")

        x0 = torch.randn(37, 24, generator=g)
        members = [(torch.randn(o, 24, generator=g) * 0.2, torch.randn(r, 24, generator=g) * 0.2,
                    torch.randn(o, r, generator=g)) for o, r in [(24, 4), (24, 4), (16, 8)]]  # fmt: skip
        results = []
        for fn in (eager_op("lora_group"), lora_group):
            x = x0.clone().requires_grad_(True)
            downs = [d.clone().requires_grad_(True) for _, d, _ in members]
            ups = [u.clone().requires_grad_(True) for _, _, u in members]
            outs = fn(x, [w for w, _, _ in members], [None] * 3, downs, ups, [0.5, 1.0, 2.0])
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            results.append([*outs, x.grad, *(d.grad for d in downs), *(u.grad for u in ups)])
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        # inside a grad_sink window the adapter's gradients are added into .grad by the kernels' atomics
        from kohakumoss_kernels.runtime import grad_sink

        lora_linear = backend_fn("lora_linear", "addmm_lowrank")

        w, d0, u0 = (
            torch.randn(19, 24, generator=g),
            torch.randn(4, 24, generator=g),
            torch.randn(19, 4, generator=g),
        )
        grads = []
        for sink in (False, True):
            d, u = d0.clone().requires_grad_(True), u0.clone().requires_grad_(True)
            d.grad, u.grad = torch.ones_like(d), torch.ones_like(u)
            with grad_sink.into([d, u] if sink else []):
                lora_linear(x0, w, None, d, u, 0.5).sum().backward()
            grads.append((d.grad, u.grad))
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        print("ok lowrank", flush=True)
        # fp8 frozen bases' passes: scales and the transposed bytes (the interpreter's own fp32 -> e4m3
        # cast rounds differently from the GPU's, so the quantized bytes are compared on the GPU only)
        from kohakumoss_kernels.weights import fp8, fp8_triton

        parts = [
            torch.randn(7, 40, generator=g) * 3,
            torch.randn(7, 24, generator=g),
            torch.randn(7, 8, generator=g),
        ]
        col = torch.rand(72, generator=g) + 0.5
        for n in (1, 2, 3):  # a group's gradients read side by side
            src = parts[0] if n == 1 else parts[:n]
            c = col[: sum(p.shape[1] for p in parts[:n])]
            _, s = fp8_triton.quantize_rows(src, c)
            assert torch.equal(s, fp8.quantize_rows_eager(src, c)[1]), f"quantize_rows scales, {n} sources"
        datas = [torch.randn(70, 50, generator=g).to(fp8.E4M3), torch.randn(30, 50, generator=g).to(fp8.E4M3)]
        ref = torch.cat(datas).t().contiguous().view(torch.uint8)
        assert torch.equal(fp8_triton.transpose_cat(datas).view(torch.uint8), ref), "transpose_cat"
        print("ok fp8", flush=True)
