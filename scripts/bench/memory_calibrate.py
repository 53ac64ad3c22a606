"""Measure the memory estimator's constants on the GPU: one moss-image-5b block, LoRA on its linears.

    python scripts/bench/memory_calibrate.py            (writes calibration.json under $OUT when set)
    PROFILE=1 python scripts/bench/memory_calibrate.py  (also the profiler's top kernels of one step)

Per checkpoint mode (none, attn, mlp, full) and with activation offload: the bytes a block keeps for
its backward (saved-tensor hooks, deduplicated by storage, weights excluded) and the extra peak of
one block's forward + backward above what it keeps (its working set). Also the pinned host<->device
copy rate and one block's forward / forward + backward time per mode (the catalog's cost model).
Everything is per token and per model dim where it scales so, as kohakumoss/memory/calibration.py
stores it; the block's kept bytes and the text refiner's share of the fixed part are printed beside
calibration.py's DERIVED counts.
"""

from __future__ import annotations

import json
import os
import time

import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.config.train import TrainConfig
from kohakumoss.memory.estimate import refiner_saved
from kohakumoss.memory.install import install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.model import MossBackbone, PackedSeq, get_preset
from kohakumoss_common.timing import median_ms

PRESET = "moss-image-5b"
SAMPLES = 2
IMAGE_TOKENS = 4096  # 1 MP
TEXT_TOKENS = 256
BLOCKS = 3  # per-block figures are the difference between 3 blocks and 1
RANK = 32
MODES = ("none", "attn", "mlp", "full")
PROFILE = (
    False  # also print torch.profiler's top CUDA kernels and the host time of one block step (mode none)
)


def build(cfg, device):
    small = type(cfg)(**{**cfg.__dict__, "depth": BLOCKS})
    with torch.device(device):
        model = MossBackbone(small).to(torch.bfloat16)
    model.init_weights(std=0.02)
    model.requires_grad_(False)
    net = build_adapter(model, algo="lora", rank=RANK, alpha=RANK, preset="full", bypass=True)
    net.to(device=device, dtype=torch.float32)
    return model, net


def measure(model, net, inputs) -> tuple[int, int]:
    """(bytes the forward leaves for the backward, peak of forward + backward), above the start."""

    def forward():
        with torch.autocast("cuda", torch.bfloat16):
            return model(*inputs).float().pow(2).mean()

    with model.ops.tuning():  # warm-up, as the trainer's first step: backends timed per shape, kernels built
        forward().backward()
    net.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = forward()
    kept = torch.cuda.memory_allocated() - base
    loss.backward()
    peak = torch.cuda.max_memory_allocated() - base
    del loss
    net.zero_grad(set_to_none=True)
    return kept, peak


def profile_block(model, net, inputs, results: dict) -> None:
    """Where one step of the short stack spends its time: top CUDA kernels, and host vs device time."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(*inputs).float().pow(2).mean()
        loss.backward()
        net.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()  # host time: how long Python takes to enqueue the step (the GPU may still be running)
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    device_ms = median_ms(step, 0, 3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(f"host enqueue {host_ms / BLOCKS:.2f} ms per block vs device {device_ms / BLOCKS:.2f} ms per block")
    print(table)
    results["profile"] = {"host_ms_per_block": host_ms / BLOCKS, "device_ms_per_block": device_ms / BLOCKS}


def graphed_block_ms(model, net, inputs) -> float | None:
    """One block's forward + backward when the step replays from a CUDA graph (train/graphs.py)."""
    from kohakumoss.train.graphs import StepGraphs
    from kohakumoss.train.step import DeviceBatch

    img, text, sigma, seq = inputs

    def loss_fn(batch, s, _noise):
        with torch.autocast("cuda", torch.bfloat16):
            return model(batch.x0, batch.text, s, batch.seq).float().pow(2).mean()

    graphs = StepGraphs(loss_fn, list(net.parameters()))
    batch = DeviceBatch(img, text, seq)

    def step():
        graphs.run(batch, sigma, img)
        net.zero_grad(set_to_none=False)

    with model.ops.tuning(device_time=True):  # backends chosen by device time, as a graphed trainer does
        step()
    ms = median_ms(step, 3, 5)  # the first call captures, the rest replay
    if graphs.failed is not None or not graphs.replays:
        print(f"CUDA graph capture failed: {graphs.failed}")
        return None
    return ms / BLOCKS


def main() -> None:
    assert torch.cuda.is_available(), "this calibration needs a CUDA GPU"
    dev = torch.device("cuda")
    cfg = get_preset(PRESET)
    side = int(IMAGE_TOKENS**0.5)
    seq = PackedSeq.build([TEXT_TOKENS] * SAMPLES, [(side, side)] * SAMPLES, dev)
    T, d = seq.total_tokens, cfg.dim
    g = torch.Generator(device=dev).manual_seed(0)
    img = torch.randn(seq.img_index.numel(), cfg.in_channels, device=dev, generator=g)
    text = torch.randn(seq.text_index.numel(), cfg.text_dim, device=dev, generator=g)
    sigma = torch.rand(SAMPLES, device=dev, generator=g)
    inputs = (img, text, sigma, seq)
    results: dict = {"preset": PRESET, "tokens": T, "dim": d, "blocks": BLOCKS, "rank": RANK, "modes": {}}

    model, net = build(cfg, dev)
    block_bytes = sum(p.numel() * p.element_size() for p in model.layers[0].parameters())
    blocks = model.layers
    for mode in MODES:
        for offload in ("none", "on"):
            plan = MemoryPlan(checkpointing=mode, activation_offload=offload)
            engines = install_memory_plan(plan, model, dev)
            if engines.offload is not None:
                engines.offload.keep_tensors(net.parameters())
            sizes = {}
            for nb in (1, BLOCKS):
                model.layers = torch.nn.ModuleList(blocks[:nb])
                sizes[nb] = measure(model, net, inputs)
            model.layers = blocks

            def step():
                with torch.autocast("cuda", torch.bfloat16):
                    loss = model(*inputs).float().pow(2).mean()
                loss.backward()
                net.zero_grad(set_to_none=True)

            ms = median_ms(step, 1, 3)
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                fwd_ms = median_ms(lambda: model(*inputs), 1, 3)
            per_block = (sizes[BLOCKS][0] - sizes[1][0]) / (BLOCKS - 1)
            fixed = sizes[1][0] - per_block
            working = sizes[BLOCKS][1] - sizes[BLOCKS][0]
            key = mode if offload == "none" else f"{mode}+offload"
            results["modes"][key] = {
                "kept_bytes_per_block": per_block,
                "kept_per_token_dim": per_block / (T * d),
                "kept_fixed_bytes": fixed,
                "working_bytes": working,
                "working_per_token_dim": working / (T * d),
                "block_fwd_ms": fwd_ms / BLOCKS,
                "block_fwd_bwd_ms": ms / BLOCKS,
            }
            model.block_runner = None
    results["graphed"] = graphed_block_ms(model, net, inputs)
    results["chosen"] = model.ops.chosen()
    if PROFILE or os.environ.get("PROFILE") == "1":
        profile_block(model, net, inputs, results)
    host = torch.empty(block_bytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(block_bytes, dtype=torch.uint8, device=dev)
    h2d = median_ms(lambda: gpu.copy_(host, non_blocking=True), 2, 5)
    d2h = median_ms(lambda: host.copy_(gpu, non_blocking=True), 2, 5)
    results["block_bytes"] = block_bytes
    results["h2d_gbps"] = block_bytes / h2d / 1e6
    results["d2h_gbps"] = block_bytes / d2h / 1e6
    t0 = time.perf_counter()
    torch.empty(block_bytes, dtype=torch.uint8, pin_memory=True)
    results["pin_alloc_ms"] = (time.perf_counter() - t0) * 1e3

    print(
        f"{PRESET} block at {T} tokens, LoRA r{RANK} on every linear, bf16; block {block_bytes / 2**20:.0f} MiB"
    )
    head = (
        f"{'mode':<14} {'kept/block MiB':>14} {'kept B/(tok*d)':>14} {'fixed MiB':>10} {'work B/(tok*d)':>14}"
    )
    print(head + f" {'fwd ms':>8} {'f+b ms':>8}")
    for key, r in results["modes"].items():
        print(
            f"{key:<14} {r['kept_bytes_per_block'] / 2**20:>14.1f} {r['kept_per_token_dim']:>14.2f} "
            f"{r['kept_fixed_bytes'] / 2**20:>10.1f} {r['working_per_token_dim']:>14.2f} "
            f"{r['block_fwd_ms']:>8.2f} {r['block_fwd_bwd_ms']:>8.2f}"
        )
    derived = (12 * d + 3 * cfg.mlp_hidden) * 2 / d  # calibration.py's DERIVED count of what a block saves
    refiner = refiner_saved(
        TrainConfig.from_knobs(
            {
                "TARGET_PRESET": "full",
                "TOKENS_PER_STEP": T,
                "AREA": IMAGE_TOKENS * 256,
                "MAX_TEXT_TOKENS": TEXT_TOKENS,
            }
        ),
        cfg,
    )
    fixed = results["modes"]["none"]["kept_fixed_bytes"]
    results["derived"] = {"block_kept_per_token_dim": derived, "refiner_saved_bytes": refiner}
    print(
        f"derived: a block keeps {derived:.2f} B/(tok*d) (12 d + 3 h bf16 values); outside the blocks the "
        f"refiner keeps {refiner / 2**20:.1f} MiB of the measured 'none' fixed {fixed / 2**20:.1f} MiB: "
        f"FIXED_PER_TOKEN_DIM = {(fixed - refiner) / (T * d):.2f}"
    )
    if results["graphed"] is not None:
        print(f"none, CUDA-graphed step: f+b {results['graphed']:.2f} ms per block")
    print("backends chosen: " + json.dumps(results["chosen"]))
    print(
        f"pinned copies: host->device {results['h2d_gbps']:.1f} GB/s, device->host {results['d2h_gbps']:.1f} GB/s"
    )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "calibration.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
