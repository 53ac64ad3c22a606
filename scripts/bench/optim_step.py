"""Optimizer step time and state memory per OPTIMIZER on the parameter set of a real run's shape.

    python scripts/bench/optim_step.py [--mode lora|full] [--preset moss-image-5b] [--rank 32]
        [--optimizers adamw,adafactor,adamw8bit,prodigy,schedulefree_adamw] [--steps 20] [--out FILE.json]

`lora`: the down [r, in] and up [out, r] fp32 matrices of a LoRA on every `--targets` linear of the preset
(shapes read from the model built on the meta device); `full`: every parameter of the preset, the update
rule replacing AdamW beside Muon as in the trainer (`--no-muon`: everything). Random weights and fixed
random gradients: this times the optimizer alone, built exactly as the trainer builds it (the memory
engines' 'gpu' placement, so AdamW steps fused). Prints one row per optimizer: median step ms, state GiB
(the optimizer's own tensors), peak GiB above the parameters and gradients. GPU (CPU works, slowly).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import torch

from kohakumoss.adapters.targets import TARGET_PRESETS
from kohakumoss.memory.engines.optimizer import PlacedOptimizer
from kohakumoss.model.backbone import MossBackbone
from kohakumoss.model.presets import get_preset
from kohakumoss.optim.build import build_adapter_optimizer, build_full_ft_optimizer
from kohakumoss.optim.names import optimizer_problem

# the LR each optimizer is run at: a typical one for it (Prodigy estimates its own step size from 1.0)
LRS = {"prodigy": 1.0, "adafactor": 1e-2}


def lora_shapes(model: torch.nn.Module, preset: str, rank: int) -> list[tuple[int, ...]]:
    patterns = [re.compile(p) for p in TARGET_PRESETS[preset]]
    shapes = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and any(p.fullmatch(name) for p in patterns):
            shapes += [(rank, mod.in_features), (mod.out_features, rank)]
    return shapes


def state_bytes(opt) -> int:
    seen, total = set(), 0
    for member in opt.optimizers.values():
        for st in member.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.data_ptr() not in seen:
                    seen.add(v.data_ptr())
                    total += v.numel() * v.element_size()
    return total


def build(args, name: str, device: torch.device):
    lr = LRS.get(name, 1e-4)
    if args.mode == "lora":
        with torch.device("meta"):
            meta = MossBackbone(get_preset(args.preset))
        g = torch.Generator(device=device).manual_seed(0)
        params = [
            torch.nn.Parameter(torch.randn(s, device=device, generator=g) * 0.01)
            for s in lora_shapes(meta, args.targets, args.rank)
        ]
        opt = build_adapter_optimizer([{"params": params, "weight_decay": 0.0}], lr, name)
    else:
        with torch.device(device):
            model = MossBackbone(get_preset(args.preset))
        model.requires_grad_(True)
        params = list(model.parameters())
        opt = build_full_ft_optimizer(model, lr=lr, optimizer=name, use_muon=not args.no_muon)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params, PlacedOptimizer(opt, "gpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(args, name: str, device: torch.device) -> dict:
    params, opt = build(args, name, device)
    sync(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.warmup + args.steps):
        sync(device)
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
    row = {
        "optimizer": name,
        "mode": args.mode,
        "params": sum(p.numel() for p in params),
        "step_ms": statistics.median(times),
        "state_gib": state_bytes(opt) / 2**30,
        "peak_above_params_gib": peak / 2**30,
    }
    del params, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("lora", "full"), default="lora")
    ap.add_argument("--preset", default="moss-image-5b")
    ap.add_argument("--targets", default="attn-mlp", choices=tuple(TARGET_PRESETS))
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--optimizers", default="adamw,adafactor,adamw8bit,prodigy,schedulefree_adamw")
    ap.add_argument("--no-muon", action="store_true", help="full: the chosen optimizer over every parameter")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    print(f"optimizer step, {args.mode} on {args.preset} (random weights and gradients), {device}")
    print(f"{'optimizer':<20} {'params':>14} {'step ms':>9} {'state GiB':>10} {'peak+ GiB':>10}")
    rows = []
    for name in args.optimizers.split(","):
        if problem := optimizer_problem(name):
            print(f"{name:<20} skipped: {problem}")
            continue
        row = run_one(args, name, device)
        rows.append(row)
        print(
            f"{name:<20} {row['params']:>14,} {row['step_ms']:>9.2f} {row['state_gib']:>10.3f}"
            f" {row['peak_above_params_gib']:>10.3f}"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": str(device), "args": vars(args), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
