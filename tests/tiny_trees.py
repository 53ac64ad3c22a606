"""Tiny weights trees as users download them, written by the project's own writers, and a real-photo set.

- `write_comfy_models`: a ComfyUI models folder shaped like the Comfy-Org repository: a ConvRot int8 DiT
  (comfy layout, every block linear rotated per the published format), a ConvRot int8 single-file text
  encoder, a single-file VAE, and the tokenizer where the README's `hf download` puts it.
- `write_hf_snapshot`: the MOSS-Image-Base HF repository's layout (`transformer/`, `text_encoder/`, `vae/`,
  `tokenizer/`).
- `write_photo_set`: a kohya folder of real photos (Debian's gnome-backgrounds wallpapers), or None.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from transformers.models.qwen3_5 import Qwen3_5TextModel

from kohakumoss.encoders.text_layouts import model_to_comfy
from kohakumoss.encoders.tiny import tiny_text_model, tiny_vae, tiny_vision_model, write_word_tokenizer
from kohakumoss.model.backbone import MossBackbone
from kohakumoss.model.convrot_file import save_convrot_dit
from kohakumoss.model.io import save_backbone
from kohakumoss.model.presets import get_preset
from kohakumoss_common.io import save_safetensors
from kohakumoss_common.quant import convrot_marker, convrot_quantize

WALLPAPERS = Path("/usr/share/backgrounds/gnome")
PHOTOS = ("adwaita-l.webp", "grid-l.webp", "truchet-l.webp", "wood-l.webp")
DIT_FILE = "moss_image_base_int8_convrot.safetensors"
TEXT_FILE = "qwen3.5_9b_int8_convrot.safetensors"
VAE_FILE = "flux2-vae_small.safetensors"


def _convrot_tensors(state: dict[str, torch.Tensor], keys: list[str], group: int) -> dict[str, torch.Tensor]:
    """`state` with `keys` stored ConvRot int8 (a scale and a `comfy_quant` marker each)."""
    out = dict(state)
    for key in keys:
        stem = key.removesuffix(".weight")
        out[key], out[stem + ".weight_scale"] = convrot_quantize(state[key], group)
        out[stem + ".comfy_quant"] = convrot_marker(group)
    return out


def write_convrot_dit(folder: Path, seed: int = 0, group: int = 256) -> Path:
    """The tiny DiT as Comfy-Org ships the base model (`model.convrot_file`): block linears ConvRot int8."""
    torch.manual_seed(seed)
    return save_convrot_dit(MossBackbone(get_preset("tiny")), Path(folder) / DIT_FILE, group)


def write_convrot_text_encoder(path: Path, model: Qwen3_5TextModel, group: int = 16) -> Path:
    """A single-file text encoder as Comfy-Org ships it: comfy key names, block linears ConvRot int8."""
    state = {model_to_comfy(k): v for k, v in model.state_dict().items()}
    names = {
        model_to_comfy(k) for k, v in model.state_dict().items() if k.startswith("layers.") and v.dim() == 2
    }
    state = _convrot_tensors(state, sorted(n for n in names if state[n].shape[1] % group == 0), group)
    save_safetensors(state, path)
    return path


def _vocab(tokenizer: Path) -> int:
    return len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])


def write_comfy_models(root: Path, captions: Sequence[str]) -> Path:
    """`root` (a ComfyUI/models folder) as the README's two `hf download` commands leave it."""
    root = Path(root)
    write_convrot_dit(root / "diffusion_models")
    tokenizer = write_word_tokenizer(root / "text_encoders" / "qwen3.5_tokenizer" / "tokenizer", captions)
    write_convrot_text_encoder(root / "text_encoders" / TEXT_FILE, tiny_text_model(_vocab(tokenizer)))
    save_safetensors(tiny_vae().model.state_dict(), root / "vae" / VAE_FILE)
    return root


def write_hf_snapshot(root: Path, captions: Sequence[str], vision: bool = False) -> Path:
    """`root` laid out as the MOSS-Image-Base HF repository: transformer/, text_encoder/, vae/, tokenizer/.
    vision: text_encoder/ holds a tiny vision tower (`model.visual.*`) as the release does, and the
    tokenizer Qwen's vision tokens (references in the prompt)."""
    root = Path(root)
    torch.manual_seed(0)
    save_backbone(MossBackbone(get_preset("tiny")), root / "transformer", layout="hf")
    tokenizer = write_word_tokenizer(root / "tokenizer", captions, vision=vision)
    model = tiny_text_model(_vocab(tokenizer))
    (root / "text_encoder").mkdir(parents=True, exist_ok=True)
    config = {"model_type": "qwen3_5", "text_config": model.config.to_dict()}
    tensors = {f"model.language_model.{k}": v for k, v in model.state_dict().items()}
    if vision:
        tower = tiny_vision_model(model.config.hidden_size)
        config["vision_config"] = tower.config.to_dict()
        tensors.update({f"model.visual.{k}": v for k, v in tower.state_dict().items()})
    (root / "text_encoder" / "config.json").write_text(json.dumps(config))
    save_safetensors(tensors, root / "text_encoder" / "model.safetensors")
    tiny_vae().model.save_pretrained(str(root / "vae"))
    return root


def write_photo_set(folder: Path, captions: Sequence[str], size: tuple[int, int] = (96, 64)) -> Path | None:
    """Real photos (one per caption, cut to `size`) with their captions in `folder`; None without them."""
    sources = [WALLPAPERS / name for name in PHOTOS[: len(captions)]]
    if len(sources) < len(captions) or not all(p.exists() for p in sources):
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, (source, caption) in enumerate(zip(sources, captions)):
        im = Image.open(source).convert("RGB")
        im.draft("RGB", (size[0] * 2, size[1] * 2))
        im.resize(size, Image.Resampling.LANCZOS).save(folder / f"{i:04d}.jpg", quality=92)
        (folder / f"{i:04d}.txt").write_text(caption)
    return folder
