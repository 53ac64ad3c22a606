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


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_kernels_match_eager_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / "interpret_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 11, proc.stdout  # nine ops, the LoRA rank-r products, the fp8 passes
