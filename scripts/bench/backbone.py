"""Backbone forward + backward on the GPU: the moss-image-5b preset with random bf16 weights.

    kogine run scripts/bench/backbone.py [--set PRESET=moss-image-5b --set SAMPLES=2 ...]
    python scripts/bench/backbone.py

Two samples packed at 1 MP (4096 image + 256 text tokens each) by default. Times forward and
forward + backward (all parameters trainable) through the op registry's eager and auto backends,
prints a table (TF/s by kohakumoss.memory.flops.step_flops, every weight trained) and writes
backbone_bench.json under $OUT when set.
"""

from __future__ import annotations

import json
import os
import time

import torch

from kohakumoss.memory.flops import step_flops
from kohakumoss.model import MossBackbone, PackedSeq, get_preset
from kohakumoss_common.timing import median_ms
from kohakumoss_kernels import OpSet

PRESET = "moss-image-5b"
SAMPLES = 2
IMAGE_TOKENS = 4096  # 64 x 64 token grid = 1024 x 1024 px
TEXT_TOKENS = 256
BACKENDS = "eager,auto"
WARMUP = 2
ITERS = 5
DTYPE = "bfloat16"


def main() -> None:
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    dtype = getattr(torch, DTYPE)
    cfg = get_preset(PRESET)
    side = int(IMAGE_TOKENS**0.5)
    seq = PackedSeq.build([TEXT_TOKENS] * SAMPLES, [(side, side)] * SAMPLES, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    img = torch.randn(seq.img_index.numel(), cfg.in_channels, device="cuda", dtype=dtype, generator=g)
    text = torch.randn(seq.text_index.numel(), cfg.text_dim, device="cuda", dtype=dtype, generator=g)
    sigma = torch.rand(SAMPLES, device="cuda", generator=g)

    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = MossBackbone(cfg).to(dtype)
    model.init_weights(std=0.02)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"built {PRESET}: {n_params / 1e9:.3f}B params in {time.perf_counter() - t0:.1f}s, tokens {seq.total_tokens}"
    )

    rows = []
    for backend in BACKENDS.split(","):
        model.ops = OpSet(backend)

        def forward():
            with torch.no_grad():
                return model(img, text, sigma, seq)

        def forward_backward():
            model.zero_grad(set_to_none=True)
            out = model(img, text, sigma, seq)
            out.float().pow(2).mean().backward()

        try:
            torch.cuda.reset_peak_memory_stats()
            fwd = median_ms(forward, WARMUP, ITERS)
            fwd_peak = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            fb = median_ms(forward_backward, WARMUP, ITERS)
            fb_peak = torch.cuda.max_memory_allocated() / 2**30
        except Exception as e:  # report and go on with the next backend
            print(f"{backend}: failed: {type(e).__name__}: {e}")
            continue
        model.zero_grad(set_to_none=True)
        lens = ([IMAGE_TOKENS] * SAMPLES, [TEXT_TOKENS] * SAMPLES)
        flops_fwd = step_flops(cfg, *lens, full=True, backward=False)
        flops_fwd_bwd = step_flops(cfg, *lens, full=True)
        rows.append(
            dict(
                backend=backend,
                fwd_ms=fwd,
                fwd_bwd_ms=fb,
                fwd_peak_gib=fwd_peak,
                fwd_bwd_peak_gib=fb_peak,
                fwd_tflops=flops_fwd / fwd / 1e9,
                fwd_bwd_tflops=flops_fwd_bwd / fb / 1e9,
            )
        )
    print(
        f"\n{PRESET}, {SAMPLES} x ({IMAGE_TOKENS} img + {TEXT_TOKENS} text) tokens packed, {DTYPE}, {torch.cuda.get_device_name()}"
    )
    print(
        f"{'backend':<8} {'fwd ms':>8} {'fwd+bwd ms':>11} {'fwd TF/s':>9} {'f+b TF/s':>9} {'fwd peak GiB':>13} {'f+b peak GiB':>13}"
    )
    for r in rows:
        print(
            f"{r['backend']:<8} {r['fwd_ms']:>8.1f} {r['fwd_bwd_ms']:>11.1f} {r['fwd_tflops']:>9.0f} {r['fwd_bwd_tflops']:>9.0f} "
            f"{r['fwd_peak_gib']:>13.1f} {r['fwd_bwd_peak_gib']:>13.1f}"
        )
    if out := os.environ.get("OUT"):
        with open(os.path.join(out, "backbone_bench.json"), "w") as f:
            json.dump(dict(preset=PRESET, samples=SAMPLES, tokens=seq.total_tokens, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
