"""The AdaLN ops' Triton kernels under TRITON_INTERPRET=1 with the model's mixed dtypes (a subprocess of
test_triton_interpret): x, y, shift and gate in bf16 with the folded norm scale in float32, and all in
float32; the per-sample parameters trained or frozen in each combination the model can produce."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from cases import compare_mixed  # noqa: E402

DTYPES = [(torch.bfloat16, torch.float32), (torch.float32, torch.float32)]  # (x, shift, gate), scale
TRAINED = {  # which per-sample parameters require a gradient
    "norm_modulate": [("shift", "scale"), ("scale",), ("shift",), ()],
    "residual_norm_modulate": [("gate", "shift", "scale"), ("scale",), ("gate", "shift"), ()],
    "gated_residual": [("gate",), ()],
}

if __name__ == "__main__":
    for op, trained_sets in TRAINED.items():
        forks = [{}, {"fork": True}] if op == "norm_modulate" else [{}]
        for dtype, scale_dtype in DTYPES:
            for trained in trained_sets:
                for kw in forks:
                    compare_mixed(op, "triton", [3, 0, 2, 6, 1], dtype, "cpu", scale_dtype, trained, kw)
        print(f"ok {op}", flush=True)
