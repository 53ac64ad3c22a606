"""One forward of any DiT checkpoint on inputs from a file, in the released transformer's tensor shapes:

    python -m kohakumoss.model.forward --weights W --inputs IN.safetensors --out OUT.safetensors
        [--dtype fp32|bf16] [--device cpu|cuda] [--skip-layers 22]

IN holds `latents` [B, in_channels, H/16, W/16] (the 2x2-patchified latent grid; tokens row-major over
the grid, channels the in_channels), `sigma` [B] in [0, 1], `text` [B, S, text_dim] and optionally
`text_mask` [B, S] (bool or 0/1: which text tokens a sample has; the released model drops the rest).
OUT gets `velocity`, shaped like latents, float32. W is any checkpoint `load_backbone` reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from pathlib import Path

import torch

from kohakumoss_common.errors import CheckpointError, ConfigError, KohakuMossError
from kohakumoss_common.io import load_tensors, save_safetensors
from kohakumoss_kernels import OpSet

from .backbone import MossBackbone
from .seq import PackedSeq

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def pack_inputs(
    latents: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, PackedSeq]:
    """[B, C, h, w] latents and [B, S, D] text (masked tokens dropped) -> packed image tokens
    [B*h*w, C], packed text tokens [T_text, D] and their PackedSeq (on the latents' device)."""
    B, C, h, w = latents.shape
    img = latents.flatten(2).transpose(1, 2).reshape(B * h * w, C)
    if text_mask is None:
        texts = list(text.unbind(0))
    else:
        texts = [t[m.bool()] for t, m in zip(text.unbind(0), text_mask.to(text.device).unbind(0))]
    seq = PackedSeq.build([t.shape[0] for t in texts], [(h, w)] * B, device=latents.device)
    return img, torch.cat(texts), seq


def velocity(
    model: MossBackbone,
    latents: torch.Tensor,
    sigma: torch.Tensor,
    text: torch.Tensor,
    text_mask: torch.Tensor | None = None,
    skip_layers: Collection[int] = (),
) -> torch.Tensor:
    """The model's velocity for [B, C, h, w] latents, float32 and shaped like them."""
    B, C, h, w = latents.shape
    img, txt, seq = pack_inputs(latents, text, text_mask)
    with torch.no_grad():
        v = model(img, txt, sigma.float().reshape(B), seq, skip_layers=skip_layers)
    return v.float().reshape(B, h * w, C).transpose(1, 2).reshape(B, C, h, w)


def _check_inputs(path: Path, inputs: dict[str, torch.Tensor], model: MossBackbone) -> None:
    cfg = model.config
    missing = [k for k in ("latents", "sigma", "text") if k not in inputs]
    if missing:
        raise CheckpointError(path, f"inputs need tensors {missing} (has {sorted(inputs)})")
    latents, sigma, text = inputs["latents"], inputs["sigma"], inputs["text"]
    B = latents.shape[0]
    problems = []
    if latents.dim() != 4 or latents.shape[1] != cfg.in_channels:
        problems.append(f"latents {tuple(latents.shape)} is not [B, {cfg.in_channels}, H/16, W/16]")
    if sigma.shape != (B,):
        problems.append(f"sigma {tuple(sigma.shape)} is not [{B}]")
    if text.dim() != 3 or text.shape[0] != B or text.shape[2] != cfg.text_dim:
        problems.append(f"text {tuple(text.shape)} is not [{B}, S, {cfg.text_dim}]")
    mask = inputs.get("text_mask")
    if mask is not None:
        if mask.shape != text.shape[:2]:
            problems.append(f"text_mask {tuple(mask.shape)} is not {tuple(text.shape[:2])}")
        elif not bool(((mask == 0) | (mask == 1)).all()) or bool((mask.sum(1) == 0).any()):
            problems.append("text_mask must be 0/1 with at least one text token per sample")
    if problems:
        raise CheckpointError(path, "; ".join(problems))


def _check_skip_layers(skip_layers: list[int], depth: int) -> None:
    bad = [i for i in skip_layers if not 0 <= i < depth]
    if bad:
        raise ConfigError("--skip-layers", f"{bad} are not block indices of a {depth}-block model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kohakumoss.model.forward", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--weights", required=True, help="a checkpoint in any layout (file, folder, HF tree)")
    parser.add_argument("--inputs", required=True, help="safetensors with latents, sigma, text[, text_mask]")
    parser.add_argument("--out", required=True, help="safetensors to write `velocity` to")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights and compute dtype")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--skip-layers", type=int, nargs="*", default=[], help="blocks left out (skip-layer guidance)"
    )
    args = parser.parse_args(argv)
    from .io import load_backbone

    device = torch.device(args.device)
    try:
        ops = OpSet("eager") if device.type == "cpu" else OpSet("auto")
        model = load_backbone(args.weights, dtype=DTYPES[args.dtype], device=device, ops=ops).eval()
        inputs = load_tensors(args.inputs)
        _check_inputs(Path(args.inputs), inputs, model)
        _check_skip_layers(args.skip_layers, model.config.depth)
        v = velocity(
            model,
            inputs["latents"].to(device),
            inputs["sigma"].to(device),
            inputs["text"].to(device),
            inputs.get("text_mask"),
            skip_layers=args.skip_layers,
        )
        save_safetensors({"velocity": v.cpu()}, args.out, metadata={"weights": str(args.weights)})
    except KohakuMossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"velocity {tuple(v.shape)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
