"""The Qwen3.5-9B text encoder's architecture with random weights, its block linears stored per
`TextEncoderConfig.quant` (none, fp8, fp8_weight, int8, int8_weight): per mode the relative error of
last_hidden_state against the bf16 encoder, the block linears' bytes, the forward's ms per prompt and
the card's peak. Random weights (seeded, HF init): the errors are the architecture's response to 8-bit
linears, not the released weights'. GPU.

    python scripts/bench/text_encoder_quant.py [--tokens 512] [--layers 32] [--out text_encoder_quant.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from transformers.models.qwen3_5 import Qwen3_5TextConfig, Qwen3_5TextModel  # noqa: E402

from kohakumoss.encoders.text_config import QWEN35_9B, TEXT_QUANTS  # noqa: E402
from kohakumoss.encoders.text_quant import quantize_text_linears  # noqa: E402


def build(layers: int, seed: int, dev: torch.device) -> Qwen3_5TextModel:
    config = Qwen3_5TextConfig(**{**QWEN35_9B, "num_hidden_layers": layers,
                                  "layer_types": QWEN35_9B["layer_types"][:layers]})  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(dev):
        model = Qwen3_5TextModel(config).to(torch.bfloat16).eval().requires_grad_(False)
    with torch.no_grad():  # zero-initialised (1 + w) norms: give them spread, as the tiny test model does
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0, 0.2)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--out", default="")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("text_encoder_quant.py needs a CUDA GPU")
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, QWEN35_9B["vocab_size"], (1, a.tokens), generator=g).to(dev)
        for _ in range(a.prompts)
    ]
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, Qwen3.5-9B architecture, "
          f"{a.layers} blocks, random weights, {a.prompts} prompts x {a.tokens} tokens")  # fmt: skip
    print(f"{'quant':>12} {'rel err':>9} {'linears GiB':>11} {'ms/prompt':>10} {'peak GiB':>9}")
    ref, rows = None, []
    for mode in TEXT_QUANTS:
        model = build(a.layers, 0, dev)
        quantize_text_linears(model, mode, dev)
        linears = [m for m in model.layers.modules() if isinstance(m, torch.nn.Linear)]
        nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        nbytes += sum(m.weight_scale.numel() * 4 for m in linears if hasattr(m, "weight_scale"))
        torch.cuda.reset_peak_memory_stats(dev)
        with torch.no_grad():
            outs = [model(input_ids=ids, use_cache=False).last_hidden_state for ids in prompts]  # warm-up too
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for ids in prompts:
                model(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000 / len(prompts)
        out = torch.cat(outs).float()
        ref = out if ref is None else ref
        err = float((out - ref).norm() / ref.norm())
        peak = torch.cuda.max_memory_allocated(dev) / 2**30
        finite = bool(torch.isfinite(out).all())
        print(
            f"{mode:>12} {err:9.2e} {nbytes / 2**30:11.2f} {ms:10.1f} {peak:9.2f}{'' if finite else ' NON-FINITE'}"
        )
        rows.append({"quant": mode, "rel_err_vs_bf16": err, "linear_gib": nbytes / 2**30, "ms_per_prompt": ms,
                     "peak_gib": peak, "finite": finite})  # fmt: skip
        del model, outs, out
        torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps({"tokens": a.tokens, "layers": a.layers, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
