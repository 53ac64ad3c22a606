"""Run the Triton kernels under TRITON_INTERPRET=1 on tiny fp32 shapes (a subprocess of test_triton_interpret)."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from cases import compare  # noqa: E402

OPS = sys.argv[1:] or [
    "rms_norm",
    "norm_modulate",
    "gated_residual",
    "residual_norm_modulate",
    "apply_rope",
    "qk_norm_rope",
    "swiglu",
    "varlen_attention",
]
SMALL = {"varlen_attention": {"heads": 2, "head_dim": 16}}

if __name__ == "__main__":
    torch.manual_seed(0)
    for op in OPS:
        compare(op, "triton", [1, 5, 19], torch.float32, "cpu", **SMALL.get(op, {}))
        print(f"ok {op}", flush=True)
