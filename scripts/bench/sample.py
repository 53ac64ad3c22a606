"""Sampling speed: the product's sampler against its plain eager path, same model, same run.

    python scripts/bench/sample.py                                   # moss-image-5b, H200: the table
    python scripts/bench/sample.py --rows eager,registry,batched,fast,streamed   # every path
    python scripts/bench/sample.py --preset tiny --device cpu --size 64 --steps 3 --text-tokens 8  # CPU smoke

Random weights (MODEL_PRESET-style, seeded) and synthetic text embeddings (random [tokens, text_dim] per
image, cond and negative): a benchmark of speed, not of images. Defaults: 1024 x 1024 px (64 x 64
tokens), 50 steps, CFG 3, skip-layer guidance on (the uncond branch skips block 22 at every step; a
model without it skips its middle block), batch 1 and 4, base precision same (bf16) and fp8.

Rows, each a `kohakumoss.diffusion.euler_sample` run on the same weights:
- eager: OpSet('eager') (the registry's reference ops), one forward per CFG branch, no CUDA graphs
- registry: the kernel registry's ops (OpSet('auto')), one forward per branch, no graphs
- batched: + both branches in one packed forward (the skipped block on the cond tokens alone)
- fast: + each step kind replayed from a CUDA graph: what scripts/sample/sample.py runs by default
- streamed: fast's settings with every block streamed from pinned host memory (graphs refused)
A row first runs a 3-step warm-up at its shape (kernel builds, the registry's tuning); the timed run is
one whole `euler_sample` call (its own first eager step and graph capture included), device-synchronized.

images/s, s/image; MFU = model FLOPs / time / --peak-tflops (the bf16 matrix rate, fp8 rows too):
forward FLOPs of both branches per step by kohakumoss.memory.flops.step_flops, less the uncond
branch's skipped blocks. `vs eager`: the row's images/s over the eager row's; `err`: the relative
L2 distance of the row's latents to the eager row's. Writes the rows as JSON to --out
(default $OUT/sample_bench.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import torch

from kohakumoss.diffusion import SamplerConfig, SamplerSpeed, euler_sample
from kohakumoss.diffusion.sampler import use_graphs
from kohakumoss.memory.flops import block_macs, step_flops
from kohakumoss.memory.install import install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.precision import BASE_PRECISIONS, quantize_frozen_linears
from kohakumoss_kernels import OpSet

PEAK_TFLOPS = 790.0  # the H200's measured bf16 matrix rate, as scripts/bench/train_step.py divides by
ROWS = ("eager", "registry", "batched", "fast", "streamed")
# row -> (ops backend, SamplerSpeed); streamed installs the streaming plan first
ROW_SPEED = {
    "eager": ("eager", SamplerSpeed(batch_cfg=False, cuda_graphs="off")),
    "registry": ("auto", SamplerSpeed(batch_cfg=False, cuda_graphs="off")),
    "batched": ("auto", SamplerSpeed(batch_cfg=True, cuda_graphs="off")),
    "fast": ("auto", SamplerSpeed()),
    "streamed": ("auto", SamplerSpeed()),
}
WARMUP_STEPS = 3  # a step kind runs eagerly, is captured, then replayed: every path the timed run takes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="moss-image-5b", help="model preset (random weights)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--rows", default="eager,fast", help=f"comma list of {', '.join(ROWS)}")
    p.add_argument("--batches", default="1,4", help="images per sampler call, comma list")
    p.add_argument("--base-precisions", default="same,fp8", help=f"comma list of {BASE_PRECISIONS}")
    p.add_argument("--size", type=int, default=1024, help="image width = height in px (multiple of 16)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--cfg", type=float, default=3.0)
    p.add_argument(
        "--skip-layers", default="", help="uncond branch's skipped blocks (empty: 22 or the middle one)"
    )
    p.add_argument("--text-tokens", type=int, default=256, help="synthetic prompt tokens per image")
    p.add_argument(
        "--negative-tokens", type=int, default=None, help="negative prompt tokens (default: --text-tokens)"
    )
    p.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="JSON path (default $OUT/sample_bench.json when $OUT is set)")
    a = p.parse_args(argv)
    a.rows = [r for r in a.rows.split(",") if r]
    a.batches = [int(b) for b in a.batches.split(",") if b]
    a.base_precisions = [b for b in a.base_precisions.split(",") if b]
    bad = [r for r in a.rows if r not in ROWS] + [b for b in a.base_precisions if b not in BASE_PRECISIONS]
    if bad or a.size % 16 or a.size <= 0 or not a.batches:
        p.error(f"unknown rows / base precisions {bad}, or --size {a.size} not a positive multiple of 16")
    if "eager" in a.rows:  # the reference the others are compared with runs first
        a.rows = ["eager", *[r for r in a.rows if r != "eager"]]
    if "streamed" in a.rows:  # it moves the blocks to the host: last
        a.rows = [*[r for r in a.rows if r != "streamed"], "streamed"]
    return a


def skip_layers(a: argparse.Namespace, depth: int) -> tuple[int, ...]:
    if a.skip_layers:
        return tuple(int(i) for i in a.skip_layers.split(","))
    return (22,) if depth > 22 else (depth // 2,)


def build_model(a: argparse.Namespace, device: torch.device, dtype: torch.dtype, base: str) -> MossBackbone:
    """Random weights in the compute dtype, frozen, the blocks' linears quantized per `base`."""
    cfg = get_preset(a.preset)
    with torch.device(device):
        model = MossBackbone(cfg, ops=OpSet("auto")).to(dtype)
    model.init_weights(std=0.02, generator=torch.Generator(device=device).manual_seed(a.seed))
    model.requires_grad_(False).eval()
    quantize_frozen_linears(model, base, device)
    return model


def sample_flops(cfg, batch: int, n_img: int, n_text: int, n_neg: int, steps: int, skipped: int) -> float:
    """Forward FLOPs of a run: both branches each step, less the uncond branch's skipped blocks."""
    cond = step_flops(cfg, [n_img] * batch, [n_text] * batch, full=False, backward=False)
    uncond = step_flops(cfg, [n_img] * batch, [n_neg] * batch, full=False, backward=False)
    L = n_img + n_neg
    skip = skipped * batch * (2.0 * block_macs(cfg) * L + 4.0 * cfg.dim * L * L)
    return steps * (cond + uncond - skip)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(a, model, ops: dict, row: str, batch: int, config: SamplerConfig, device, dtype, texts) -> dict:
    backend, speed = ROW_SPEED[row]
    model.ops = ops[backend]
    if row == "streamed" and model.block_runner is None:  # the runner takes the model's ops now
        install_memory_plan(MemoryPlan(stream_blocks=-1, stream_slots=2), model, device)
    # graphed steps: kernels chosen by device time, as sample.py does; eager steps by wall time
    model.ops.set_timing("device" if use_graphs(speed, model, device) else "wall")
    side = a.size // 16
    cond, uncond = texts
    args = (model, cond[:batch], uncond[:batch], [(side, side)] * batch, list(range(batch)))

    def call(cfg: SamplerConfig) -> list[torch.Tensor]:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            return euler_sample(*args, cfg, model.config.in_channels, device, speed=speed)

    call(replace(config, steps=min(WARMUP_STEPS, config.steps)))
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    out = call(config)
    sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return dict(row=row, batch=batch, seconds=seconds, peak_gib=peak, latents=torch.cat(out).float().cpu())


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device here (use --preset tiny --device cpu for the smoke run)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU bf16 matmuls are very slow
    cfg = get_preset(a.preset)
    skips = skip_layers(a, cfg.depth)
    config = SamplerConfig(steps=a.steps, cfg_scale=a.cfg, uncond_skip_layers=skips)
    n_img, n_text = (a.size // 16) ** 2, a.text_tokens
    n_neg = a.negative_tokens if a.negative_tokens is not None else n_text
    g = torch.Generator().manual_seed(a.seed + 1)
    nb = max(a.batches)
    texts = (
        [torch.randn(n_text, cfg.text_dim, generator=g) for _ in range(nb)],
        [torch.randn(n_neg, cfg.text_dim, generator=g) for _ in range(nb)],
    )
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{a.preset} (random weights), synthetic text embeddings, {gpu}, compute {dtype}; {a.size} x {a.size} px "
        f"({n_img} image tokens), {n_text} prompt / {n_neg} negative tokens, {a.steps} steps, CFG {a.cfg:g}, "
        f"uncond skips blocks {list(skips)} at every step"
    )
    print(HEADER, flush=True)
    results = []
    for base in a.base_precisions:
        t0 = time.perf_counter()
        model = build_model(a, device, dtype, base)
        ops = {"eager": OpSet("eager"), "auto": model.ops}  # one registry per model: rows share its tuning
        print(f"built {a.preset} base {base} in {time.perf_counter() - t0:.1f}s")
        for row in a.rows:
            for batch in a.batches:
                try:
                    r = run_row(a, model, ops, row, batch, config, device, dtype, texts)
                except Exception as e:  # report and go on with the next row
                    print(
                        f"{base}/{row}/b{batch}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    )
                    results.append(dict(base=base, row=row, batch=batch, error=f"{type(e).__name__}: {e}"))
                    save(a, results)
                    continue
                flops = sample_flops(cfg, batch, n_img, n_text, n_neg, a.steps, len(skips))
                r.update(
                    base=base,
                    images_per_s=batch / r["seconds"],
                    s_per_image=r["seconds"] / batch,
                    mfu=flops / r["seconds"] / (a.peak_tflops * 1e12),
                )
                results.append(r)
                eager = next((e for e in results if e.get("row") == "eager" and e.get("base") == base
                              and e.get("batch") == batch and "latents" in e), None)  # fmt: skip
                if eager is not None:
                    ref, lat = eager["latents"], r["latents"]
                    r["vs_eager"] = r["images_per_s"] / eager["images_per_s"]
                    r["err_vs_eager"] = float((lat - ref).norm() / ref.norm().clamp_min(1e-30))
                print(row_line(r), flush=True)
                save(a, results)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report(a, results)
    return results


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


HEADER = f"{'base':<10} {'row':<9} {'batch':>5} {'images/s':>9} {'s/image':>8} {'MFU %':>6} {'vs eager':>8} {'err':>9} {'peak GiB':>9}"


def row_line(r: dict) -> str:
    if "error" in r:
        return f"{r['base']:<10} {r['row']:<9} {r['batch']:>5}  error: {r['error'][:120]}"
    return (
        f"{r['base']:<10} {r['row']:<9} {r['batch']:>5} {r['images_per_s']:>9.3f} {r['s_per_image']:>8.2f} "
        f"{100 * r['mfu']:>6.1f} {fmt(r.get('vs_eager'), '.2f'):>8} {fmt(r.get('err_vs_eager'), '.2e'):>9} "
        f"{fmt(r['peak_gib'], '.1f'):>9}"
    )


def save(a: argparse.Namespace, results: list[dict]) -> str:
    """The rows so far as JSON (after every row: a run cut short keeps what it measured)."""
    out = a.out or (os.path.join(os.environ["OUT"], "sample_bench.json") if os.environ.get("OUT") else "")
    if out:
        rows = [{k: v for k, v in r.items() if k != "latents"} for r in results]
        with open(out, "w") as f:
            json.dump(dict(args=vars(a), rows=rows), f, indent=2)
    return out


def report(a: argparse.Namespace, results: list[dict]) -> None:
    print(
        f"\nMFU = forward FLOPs (both branches, skipped blocks left out) / time / {a.peak_tflops:g} TFLOP/s"
    )
    print(HEADER)
    for r in results:
        print(row_line(r))
    if out := save(a, results):
        print(f"rows -> {out}")


if __name__ == "__main__":
    main()
