"""PRECISION fp16 against bf16 on `moss-image-5b` (random weights, random text states; GPU): per row the
forward + backward time of one 1 MP sample (the input's gradient through every block, as a frozen
base's adapter training has), then a 50-step CFG-3 sample (skip-layer guidance on block 22) timed and
compared with the bf16 row's latents (relative error), with non-finite values counted. A 3-step sample
before it (not timed) tunes the kernels and captures the sampler's graphs.

Rows: bf16; fp16 with float32 residual streams (what PRECISION fp16 runs); fp16 with fp16 streams (the
failure the float32 streams guard against); `--fp32-ref` adds a float32 sample as a second reference.

    python scripts/bench/fp16.py [--steps 50] [--size 1024] [--iters 5] [--fp32-ref] [--out fp16.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kohakumoss.diffusion import SamplerConfig  # noqa: E402
from kohakumoss.diffusion.sampler import euler_sample  # noqa: E402
from kohakumoss.model import MossBackbone, PackedSeq, get_preset  # noqa: E402
from kohakumoss.precision import fp32_residuals  # noqa: E402

ROWS = (("bf16", torch.bfloat16, False), ("fp16 fp32-residual", torch.float16, True),
        ("fp16 fp16-residual", torch.float16, False))  # fmt: skip


def build(dtype: torch.dtype, residual32: bool, dev) -> MossBackbone:
    cfg = get_preset("moss-image-5b")
    with torch.device(dev):
        model = MossBackbone(cfg)
    model.init_weights(std=0.02, generator=torch.Generator(dev).manual_seed(0))
    fp32_residuals(model, residual32)
    return model.to(dtype).requires_grad_(False).eval()


def time_fwd_bwd(model, dtype, grid, text, iters: int, dev) -> float:
    seq = PackedSeq.build([text.shape[0]], [grid], dev)
    img = torch.randn(grid[0] * grid[1], 128, device=dev, generator=torch.Generator(dev).manual_seed(2))
    sigma = torch.full((1,), 0.5, device=dev)
    times = []
    for i in range(iters + 2):
        x = img.clone().requires_grad_(True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            v = model(x, text, sigma, seq)
        v.float().square().mean().backward()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1000


def sample(model, dtype, grid, cond, uncond, steps: int, dev) -> tuple[torch.Tensor, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        (lat,) = euler_sample(
            model, [cond], [uncond], [grid], [0], SamplerConfig(steps=steps), 128, dev, dtype
        )
    torch.cuda.synchronize()
    return lat.float(), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--size", type=int, default=1024, help="image side in px (latent grid side / 16)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--fp32-ref", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fp16.py needs a CUDA GPU")
    dev = torch.device("cuda")
    grid = (a.size // 16, a.size // 16)
    g = torch.Generator(dev).manual_seed(1)
    cond = torch.randn(300, 4096, device=dev, generator=g)
    uncond = torch.randn(20, 4096, device=dev, generator=g)
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, moss-image-5b random weights, "
          f"{a.size}x{a.size}, {a.steps} steps, CFG 3, random text states")  # fmt: skip
    print(f"{'row':>20} {'fwd+bwd ms':>10} {'sample s':>9} {'vs bf16':>9} {'vs fp32':>9} {'non-finite':>10}")
    rows = ROWS + ((("fp32", torch.float32, False),) if a.fp32_ref else ())
    out, lat_bf16, lat_fp32 = [], None, None
    results = {}
    for name, dtype, residual32 in rows:
        model = build(dtype, residual32, dev)
        ms = time_fwd_bwd(model, dtype, grid, cond.to(dtype), a.iters, dev)
        sample(model, dtype, grid, cond, uncond, 3, dev)  # kernel tuning and graph capture, not timed
        lat, secs = sample(model, dtype, grid, cond, uncond, a.steps, dev)
        results[name] = (ms, lat, secs)
        lat_bf16 = lat if name == "bf16" else lat_bf16
        lat_fp32 = lat if name == "fp32" else lat_fp32
        del model
        torch.cuda.empty_cache()
    for name, (ms, lat, secs) in results.items():
        bad = int((~torch.isfinite(lat)).sum())
        e16 = float((lat - lat_bf16).norm() / lat_bf16.norm())
        e32 = float((lat - lat_fp32).norm() / lat_fp32.norm()) if lat_fp32 is not None else float("nan")
        print(f"{name:>20} {ms:10.1f} {secs:9.2f} {e16:9.2e} {e32:9.2e} {bad:10d}")
        out.append({"row": name, "fwd_bwd_ms": ms, "sample_s": secs, "rel_err_vs_bf16": e16,
                    "rel_err_vs_fp32": e32, "non_finite": bad})  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps({"size": a.size, "steps": a.steps, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
