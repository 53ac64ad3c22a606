"""Random DiT weights written in the layouts users download, for benchmarks that load a file.

    python scripts/bench/write_weights.py OUT_DIR --preset moss-image-5b --layouts hf,comfy,convrot

The values are MODEL_PRESET's (the trainer's `build_backbone` with the same preset and seed, drawn on
--device), so a row loading one of these files trains the same function as a MODEL_PRESET row. Layouts:
- `hf`: OUT_DIR/transformer/ (the MOSS-Image-Base repository's folder: shards, index, config.json);
- `comfy`: OUT_DIR/moss_image_base_bf16.safetensors (Comfy-Org's bf16 file: q, k, v fused);
- `convrot`: OUT_DIR/moss_image_base_int8_convrot.safetensors (Comfy-Org's int8 file: the block matrices
  ConvRot int8, `kohakumoss.model.convrot_file`);
- `pipeline`: OUT_DIR/pipeline/, the MOSS-Image-Base repository's tree for a sampler that encodes its own
  prompts: `transformer/` (a link to the hf folder), `tokenizer/` (a word-level tokenizer with the chat
  template, `encoders.tiny.write_word_tokenizer`), `text_encoder/` (the Qwen3.5 architecture at the DiT's
  text width with random weights, --text-layers blocks of the released pattern instead of 32: its depth
  costs only the prompt's one encoding, not a sampler step) and `vae/` (the FLUX.2 VAE architecture with
  random weights).
A file already there is kept (the folder is reused across rows and calls).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

LAYOUT_FILES = {
    "hf": "transformer",
    "comfy": "moss_image_base_bf16.safetensors",
    "convrot": "moss_image_base_int8_convrot.safetensors",
    "pipeline": "pipeline",
}
# the words of make_images.py's captions and of the peers' sample prompt: the tokenizer's vocabulary
PROMPT_WORDS = "red blue green gold stripes waves grid dots soft sharp a lighthouse on rocky coast at sunset"


def layout_path(out: Path, layout: str) -> Path:
    """Where `layout`'s weights go under `out` (a folder for hf, a file otherwise)."""
    return Path(out) / LAYOUT_FILES[layout]


def text_config(preset: str, width: int, vocab: int, layers: int):
    """The stand-in text encoder's Qwen3.5 config: the tiny one for a small preset, else Qwen3.5-9B's
    blocks at `width` with `layers` of them (the released linear / full attention pattern, cut)."""
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    from kohakumoss.encoders.random_weights import random_size
    from kohakumoss.encoders.text_config import QWEN35_9B, tiny_text_encoder_config

    if random_size(preset) == "tiny":
        return tiny_text_encoder_config(vocab_size=max(vocab, 16))
    fields = {**QWEN35_9B, "vocab_size": max(vocab, 16), "hidden_size": width, "num_hidden_layers": layers}
    fields["layer_types"] = QWEN35_9B["layer_types"][:layers]
    return Qwen3_5TextConfig(**fields)


def write_pipeline(folder: Path, transformer: Path, preset: str, width: int, seed: int, layers: int) -> None:
    """`folder` as the MOSS-Image-Base tree (transformer/ linked to the hf folder; tokenizer/, text_encoder/
    and vae/ of random weights), for a sampler that encodes its own prompts."""
    import json

    from transformers.models.qwen3_5 import Qwen3_5TextModel

    from kohakumoss.encoders.random_weights import build_random_vae, random_size
    from kohakumoss.encoders.tiny import write_word_tokenizer
    from kohakumoss_common.io import save_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "transformer").exists():
        (folder / "transformer").symlink_to(transformer.resolve(), target_is_directory=True)
    tokenizer = write_word_tokenizer(folder / "tokenizer", [PROMPT_WORDS])
    vocab = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    model = Qwen3_5TextModel(text_config(preset, width, vocab, layers)).to(torch.bfloat16)
    (folder / "text_encoder").mkdir(exist_ok=True)
    save_safetensors({f"model.language_model.{k}": v.contiguous() for k, v in model.state_dict().items()},
                     folder / "text_encoder" / "model.safetensors")  # fmt: skip
    config = {"model_type": "qwen3_5", "text_config": model.config.to_dict()}
    (folder / "text_encoder" / "config.json").write_text(json.dumps(config))
    build_random_vae(random_size(preset), seed, "cpu", torch.float32).model.save_pretrained(
        str(folder / "vae")
    )


def write(out: Path, preset: str, layouts: list[str], seed: int = 0, device: str = "cpu",
          text_layers: int = 4) -> dict[str, Path]:  # fmt: skip
    """Write the missing layouts of `preset`'s random weights (seed `seed`, drawn on `device`); returns
    layout -> path."""
    from kohakumoss.config.train import ModelConfig
    from kohakumoss.model.convrot_file import save_convrot_dit
    from kohakumoss.model.io import save_backbone
    from kohakumoss.train.components import build_backbone

    if unknown := sorted(set(layouts) - set(LAYOUT_FILES)):
        raise SystemExit(f"--layouts: unknown {unknown}; known {sorted(LAYOUT_FILES)}")
    if "pipeline" in layouts and "hf" not in layouts:  # its transformer/ is the hf folder
        layouts = ["hf", *layouts]
    paths = {name: layout_path(out, name) for name in layouts}
    done = {"hf": "config.json", "pipeline": "vae/config.json"}
    todo = [name for name, p in paths.items() if not (p / done[name] if name in done else p).exists()]
    if not todo:
        return paths
    t0 = time.perf_counter()
    draw = torch.device(device)
    model = ModelConfig(model_preset=preset)
    # built on the host (a 5B model's two copies fit there, not beside a capped row), drawn on --device
    backbone = build_backbone(model, torch.device("cpu"), torch.bfloat16, False, seed=seed, draw=draw)
    for name in todo:
        if name == "convrot":
            save_convrot_dit(backbone, paths[name], device=draw)
        elif name == "hf":
            save_backbone(backbone, paths[name], layout="hf")
        elif name == "pipeline":
            write_pipeline(paths[name], paths["hf"], preset, backbone.config.text_dim, seed, text_layers)
        else:
            save_backbone(backbone, paths[name], layout="comfy")
        print(f"wrote {name}: {paths[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return paths


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--preset", default="moss-image-5b")
    p.add_argument(
        "--layouts", default="hf,comfy,convrot", help=f"comma-separated, of {sorted(LAYOUT_FILES)}"
    )
    p.add_argument("--seed", type=int, default=0, help="MODEL_PRESET's seed (the trainer's SEED)")
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where values are drawn"
    )
    p.add_argument(
        "--text-layers", type=int, default=4, help="blocks of the pipeline's stand-in text encoder"
    )
    a = p.parse_args(argv)
    write(Path(a.out), a.preset, [s for s in a.layouts.split(",") if s], a.seed, a.device, a.text_layers)


if __name__ == "__main__":
    main()
