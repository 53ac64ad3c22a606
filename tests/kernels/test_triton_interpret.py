"""The Triton kernels on the CPU under TRITON_INTERPRET=1, tiny fp32 shapes, in a subprocess
(the interpreter flag must be set before Triton is imported and must not leak into other tests)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _interpret(script: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_kernels_match_eager_in_the_interpreter():
    out = _interpret("interpret_check.py")
    assert out.count("ok ") == 10, out  # eight ops, the LoRA rank-r products, the fp8 passes


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_adaln_kernels_take_the_models_mixed_dtypes_in_the_interpreter():
    """bf16 activations with the float32 folded norm scale (and all float32), each parameter trained or
    frozen: outputs and gradients as the eager op's, each gradient in its input's dtype."""
    out = _interpret("interpret_mixed_dtypes.py")
    assert out.split() == ["ok", "norm_modulate", "ok", "residual_norm_modulate", "ok", "gated_residual"], out
