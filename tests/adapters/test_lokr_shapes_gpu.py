"""GPU (H200): LoKr (lycoris's fused Triton kernels, tuned from an empty kernel cache, as a user's first run)
at every linear shape of moss-image-5b with a training step's token count: forward and backward match the
same module in float32 through lycoris's torch backend.

Each shape runs in one child process that prints the shape before it starts, so a kernel that faults
(an illegal memory access ends the whole CUDA context) names the shape instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kohakumoss.memory.estimate import block_linears, outside_linears
from kohakumoss.model import get_preset

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOKENS = 2 * (4096 + 256)  # a 1 MP step of two images
RANK = 32

CHILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch import nn
    from lycoris.modules.lokr import LokrModule

    shapes, tokens, rank, device = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

    def run(module, x, backend):
        os.environ["LYCORIS_KERNEL_BACKEND"] = backend
        x = x.detach().requires_grad_(True)
        out = module(x)
        out.float().square().mean().backward()
        grads = [p.grad.detach().float().clone() for p in module.parameters() if p.requires_grad]
        module.zero_grad(set_to_none=True)
        return out.detach().float(), x.grad.float(), grads

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-12))

    for fan_in, fan_out in shapes:
        print(f"shape in={fan_in} out={fan_out}", flush=True)
        torch.manual_seed(0)
        base = nn.Linear(fan_in, fan_out, bias=False)
        lokr = LokrModule("m", base, lora_dim=rank, alpha=rank, bypass_mode=True)
        with torch.no_grad():
            for p in lokr.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn_like(p) * 0.05)
        base.requires_grad_(False)
        x = torch.randn(tokens, fan_in, device=device)
        base.to(device)  # lycoris keeps the wrapped linear outside its own modules
        ref = run(lokr.to(device), x, "torch")
        base.to(torch.bfloat16)
        got = run(lokr.to(torch.bfloat16), x.to(torch.bfloat16), "auto")
        errors = [rel(got[0], ref[0]), rel(got[1], ref[1])] + [rel(g, r) for g, r in zip(got[2], ref[2])]
        print("errors " + json.dumps([fan_in, fan_out, max(errors)]), flush=True)
    """
)


def test_lokr_trains_at_every_linear_shape_of_the_5b_model(tmp_path):
    config = get_preset("moss-image-5b")
    shapes = sorted(set(block_linears(config, "full")) | set(outside_linears(config, "full")))
    env = dict(os.environ, LYCORIS_KERNEL_CACHE_DIR=str(tmp_path / "lycoris"))  # nothing tuned yet
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(shapes), str(TOKENS), str(RANK), "cuda"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    started = [line for line in lines if line.startswith("shape ")]
    assert done.returncode == 0, f"failed at {started[-1] if started else 'start'}:\n{done.stderr[-3000:]}"
    errors = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("errors ")]
    assert len(errors) == len(shapes)
    worst = [e for e in errors if e[2] > 2e-2]  # bf16 against float32
    assert not worst, f"(in, out, relative error) beyond bf16's: {worst}"
