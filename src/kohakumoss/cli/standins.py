"""`kohakumoss-standins --out DIR --layout comfy|hf`: tiny random stand-ins of the three downloads (the MOSS
DiT, the Qwen3.5 text encoder with its tokenizer, the FLUX.2 VAE) in the folder trees the real ones come in,
so the first-LoRA guide (the config tool's `--weights`, caching, training, export) can be rehearsed on any
laptop before the 15 GB download. Random weights: the pictures are noise; every file and step is real.

  comfy: DIR/models/diffusion_models/moss_image_standin.safetensors, DIR/models/text_encoders/
         qwen3.5_standin.safetensors (ComfyUI keys) and qwen3.5_tokenizer/, DIR/models/vae/flux2-vae_standin.safetensors
  hf:    DIR/transformer/ (diffusers folder), DIR/text_encoder/ (HF folder), DIR/tokenizer/, DIR/vae/ (diffusers folder)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

from kohakumoss.encoders.text_layouts import model_to_comfy
from kohakumoss.encoders.tiny import write_tiny_text_encoder, write_tiny_vae
from kohakumoss.model.backbone import MossBackbone
from kohakumoss.model.io import save_backbone
from kohakumoss.model.presets import get_preset
from kohakumoss_common.io import load_tensors, save_safetensors

LAYOUTS = ("comfy", "hf")
# the tokenizer's words (others read as [UNK]): the guide's example captions and common caption words
WORDS = (
    "a an the of in on at with and photo picture painting drawing of style watercolor oil sketch portrait "
    "landscape cat dog person woman man red blue green yellow black white light dark sky sea night day"
)


def write_standins(out: str | Path, layout: str, seed: int = 0) -> dict[str, Path]:
    """Write the stand-in weights under `out` in `layout`; returns {WEIGHTS, TEXT_ENCODER, TOKENIZER, VAE}."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    out = Path(out)
    torch.manual_seed(seed)
    dit = MossBackbone(get_preset("tiny"))
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        text = write_tiny_text_encoder(Path(tmp) / "text", [WORDS], seed=seed)
        vae_dir = write_tiny_vae(Path(tmp) / "vae", seed=seed)
        if layout == "hf":
            paths = {"WEIGHTS": out / "transformer", "TEXT_ENCODER": out / "text_encoder"}
            paths |= {"TOKENIZER": out / "tokenizer", "VAE": out / "vae"}
            save_backbone(dit, paths["WEIGHTS"], layout="hf")
            for key, source in (
                ("TEXT_ENCODER", text.path),
                ("TOKENIZER", text.tokenizer_path),
                ("VAE", vae_dir),
            ):
                shutil.copytree(source, paths[key], dirs_exist_ok=True)
            return paths
        models = out / "models"
        paths = {
            "WEIGHTS": models / "diffusion_models" / "moss_image_standin.safetensors",
            "TEXT_ENCODER": models / "text_encoders" / "qwen3.5_standin.safetensors",
            "TOKENIZER": models / "text_encoders" / "qwen3.5_tokenizer",
            "VAE": models / "vae" / "flux2-vae_standin.safetensors",
        }
        save_backbone(dit, paths["WEIGHTS"], layout="comfy")
        hf_text = load_tensors(Path(text.path) / "model.safetensors")
        prefix = "model.language_model."  # write_tiny_text_encoder's HF keys -> ComfyUI's
        save_safetensors(
            {model_to_comfy(k[len(prefix) :]): v for k, v in hf_text.items()}, paths["TEXT_ENCODER"]
        )
        shutil.copytree(text.tokenizer_path, paths["TOKENIZER"], dirs_exist_ok=True)
        save_safetensors(load_tensors(vae_dir / "diffusion_pytorch_model.safetensors"), paths["VAE"])
        return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kohakumoss-standins", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", required=True, help="folder to write (the ComfyUI root, or the HF repo folder)"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="comfy", help="the real download's folder tree")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    paths = write_standins(args.out, args.layout, args.seed)
    print(f"stand-in weights ({args.layout} layout, random: for rehearsing, not for pictures):")
    for knob, path in paths.items():
        print(f"  {knob} = {str(path)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
