"""Reference images in the text encoder's prompt: Qwen3.5's vision tower and the `Picture N:` prefix.

As SimpleTuner 4.10.1's MOSS-Image edit flavours (and ai-toolkit's, ComfyUI's `ai-toolkit` layout):
each reference is LANCZOS-downscaled on its own to at most 384 x 384 px in total (never upscaled),
then Qwen's image processor (`Qwen2VLImageProcessorPil`: resize to multiples of patch x merge, the
mean / std 0.5 of Qwen3-VL) gives its patches and grid; the user turn is
`Picture 1: <|vision_start|><|image_pad|> x n1<|vision_end|>Picture 2: ...` followed by the caption,
with no separator, and transformers' `Qwen3_5Model` puts the tower's tokens at the `<|image_pad|>`s
with its M-RoPE positions. The hidden states of the whole prompt (vision tokens included) are the DiT's
text tokens. `reference_prompt='none'` is the format of ComfyUI's community Moss-Image-Edit LoRA: the
text encoder sees the caption alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize
from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5Model, Qwen3_5TextConfig
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.io import iter_tensors, read_header
from kohakumoss_common.quant import QuantPlan, dequantize

from .streaming import cast, check_keys, expected_shapes, meta_leftovers, set_tensor

REFERENCE_PROMPTS = ("picture", "none")  # SimpleTuner's layout | ComfyUI's Moss-Image-Edit LoRA
REFERENCE_MAX_PIXELS = 384 * 384  # each reference's size for the vision tower (SimpleTuner, ai-toolkit)
PROCESSOR_MIN_PIXELS = 1024  # SimpleTuner's image processor `size.shortest_edge`
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IMAGE_MEAN = IMAGE_STD = (0.5, 0.5, 0.5)  # Qwen3-VL's preprocessing: 2x - 1
VISION_PREFIXES = ("model.visual.", "visual.")
COMFY_WRAPPERS = (r"^text_encoders\.[^.]+\.transformer\.", r"^transformer\.")
# Qwen3.5-9B's vision tower (patch 16, merge 2, 27 blocks, 4096 out: gguf-trainer's constants);
# heads are not visible in the shapes of a single file
QWEN35_9B_VISION: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 4096,
    "num_position_embeddings": 2304,
}

ReferenceImage = Image.Image | torch.Tensor  # a PIL image, or uint8 [3, H, W]


def vision_key(key: str) -> str | None:
    """A checkpoint key -> its `Qwen3_5VisionModel` name, or None when it is not the vision tower's."""
    for wrapper in COMFY_WRAPPERS:
        key = re.sub(wrapper, "", key)
    for prefix in VISION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return None


def vision_keys(keys: Sequence[str]) -> dict[str, str]:
    return {k: n for k in keys if (n := vision_key(k)) is not None}


def vision_tower_problem(path: str | Path) -> str | None:
    """Why the text-encoder checkpoint at `path` cannot show references to a vision tower (None: it can);
    reads the header only."""
    header, _ = read_header(Path(path))
    if vision_keys(list(header)):
        return None
    return (
        f"{path} holds no vision tower (no visual.* tensors: a text-only Qwen3.5 file); give the whole "
        "text_encoder/ folder of the MOSS-Image release, or leave references out of the prompt ('none', "
        "the ComfyUI Moss-Image-Edit LoRA format)"
    )


def downscaled_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """(w, h) at most `max_pixels` in total, aspect kept, never upscaled."""
    if width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(1, int(width * scale)), max(1, int(height * scale))


def downscale(image: Image.Image, max_pixels: int) -> Image.Image:
    """LANCZOS-downscaled to at most `max_pixels` in total, aspect kept, never upscaled."""
    size = downscaled_size(*image.size, max_pixels)
    return image if size == image.size else image.resize(size, Image.Resampling.LANCZOS)


def as_pil(image: ReferenceImage) -> Image.Image:
    """A reference as an RGB PIL image (uint8 [3, H, W] tensors accepted)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if (
        isinstance(image, torch.Tensor)
        and image.dtype == torch.uint8
        and image.ndim == 3
        and image.shape[0] == 3
    ):
        return Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).cpu().numpy()), "RGB")
    raise TypeError(
        f"a reference image is a PIL image or a uint8 [3, H, W] tensor, got {type(image).__name__}"
    )


def image_digest(image: ReferenceImage) -> str:
    """sha256 of a reference's pixels and size: equal images share one encoding in a call."""
    pil = as_pil(image)
    digest = hashlib.sha256(f"{pil.size}".encode())
    digest.update(pil.tobytes())
    return digest.hexdigest()


def reference_prefix(token_counts: Sequence[int]) -> str:
    """`Picture 1: <|vision_start|><|image_pad|> x n<|vision_end|>Picture 2: ...` (placed before the caption)."""
    return "".join(
        f"Picture {i}: {VISION_START}{IMAGE_PAD * n}{VISION_END}" for i, n in enumerate(token_counts, 1)
    )


def folder_vision_config(path: Path) -> Qwen3_5VisionConfig | None:
    """The `vision_config` of an HF folder's config.json (None: no folder, or no vision config)."""
    file = path / "config.json"
    if not path.is_dir() or not file.exists():
        return None
    raw = json.loads(file.read_text()).get("vision_config")
    if raw is None:
        return None
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    return Qwen3_5VisionConfig(**raw)


def infer_vision_config(shapes: dict[str, tuple[int, ...]], path: object) -> Qwen3_5VisionConfig:
    """A vision config from `Qwen3_5VisionModel`-named shapes; the head count from the 9B preset."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in shapes:
            raise CheckpointError(
                path, f"cannot infer the vision tower's config: key visual.{key} is missing"
            )
        return shapes[key]

    hidden, _, temporal, patch, _ = shape("patch_embed.proj.weight")
    depth = len({int(m[1]) for k in shapes if (m := re.match(r"^blocks\.(\d+)\.", k))})
    merged = shape("merger.linear_fc1.weight")[1]
    return Qwen3_5VisionConfig(
        **{
            **QWEN35_9B_VISION,
            "depth": depth,
            "hidden_size": hidden,
            "intermediate_size": shape("blocks.0.mlp.linear_fc1.weight")[0],
            "patch_size": patch,
            "temporal_patch_size": temporal,
            "spatial_merge_size": round((merged // hidden) ** 0.5),
            "out_hidden_size": shape("merger.linear_fc2.weight")[0],
            "num_position_embeddings": shape("pos_embed.weight")[0],
        }
    )


class VisionTower:
    """Qwen3.5's vision tower with its image processor and prompt tokens, for references in the prompt."""

    def __init__(self, model: Qwen3_5VisionModel, tokenizer, max_pixels: int = REFERENCE_MAX_PIXELS):
        self.model = model.eval().requires_grad_(False)
        self.config: Qwen3_5VisionConfig = model.config
        self.max_pixels = int(max_pixels)
        merge = self.config.spatial_merge_size
        self.processor = Qwen2VLImageProcessorPil(
            patch_size=self.config.patch_size,
            merge_size=merge,
            temporal_patch_size=self.config.temporal_patch_size,
            size={
                "shortest_edge": PROCESSOR_MIN_PIXELS,
                "longest_edge": max(self.max_pixels, PROCESSOR_MIN_PIXELS),
            },
            image_mean=list(IMAGE_MEAN),
            image_std=list(IMAGE_STD),
        )
        self.token_ids = {t: _special_id(tokenizer, t) for t in (VISION_START, IMAGE_PAD, VISION_END)}

    @property
    def settings(self) -> dict[str, Any]:
        """What shapes the vision tokens besides the weights: part of the encoder's identity."""
        model_config = {k: v for k, v in self.config.to_dict().items() if not k.startswith("_")}
        for key in ("transformers_version", "dtype"):
            model_config.pop(key, None)
        return {
            "prompt": "Picture N: <|vision_start|>...<|vision_end|> before the caption",
            "max_pixels": self.max_pixels,
            "resize": "lanczos, never up",
            "processor": {"min_pixels": PROCESSOR_MIN_PIXELS, "mean": IMAGE_MEAN, "std": IMAGE_STD},
            "vision": model_config,
        }

    def token_count(self, width: int, height: int) -> int:
        """Vision tokens of a `width` x `height` reference (the processor's resize, without the pixels)."""
        w, h = downscaled_size(width, height, self.max_pixels)
        patch, merge = self.config.patch_size, self.config.spatial_merge_size
        longest = self.processor.size["longest_edge"]
        rh, rw = smart_resize(h, w, patch * merge, PROCESSOR_MIN_PIXELS, longest)
        return (rh // patch) * (rw // patch) // merge**2

    def prepare(self, images: Sequence[ReferenceImage]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """References -> (pixel_values [patches, C*T*P*P], image_grid_thw [M, 3], vision tokens per image)."""
        pil = [downscale(as_pil(im), self.max_pixels) for im in images]
        out = self.processor(images=pil, return_tensors="pt")
        grid = out["image_grid_thw"]
        counts = (grid.prod(-1) // self.config.spatial_merge_size**2).tolist()
        return out["pixel_values"], grid, counts

    def multimodal(self, text_model: torch.nn.Module, text_config: Qwen3_5TextConfig) -> Qwen3_5Model:
        """transformers' `Qwen3_5Model` around the loaded text model and this tower (no weights copied)."""
        config = Qwen3_5Config(
            text_config=text_config.to_dict(),
            vision_config=self.config.to_dict(),
            image_token_id=self.token_ids[IMAGE_PAD],
            vision_start_token_id=self.token_ids[VISION_START],
            vision_end_token_id=self.token_ids[VISION_END],
        )
        with torch.device("meta"):
            model = Qwen3_5Model(config)
        model.language_model = text_model
        model.visual = self.model
        return model.eval().requires_grad_(False)


def _special_id(tokenizer, token: str) -> int:
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id:
        raise ConfigError(
            "text_encoder.tokenizer_path",
            f"the tokenizer has no {token} token, which references in the prompt need (Qwen3.5's tokenizer has it)",
        )
    return int(tid)


def load_vision_tower(
    path: Path,
    header: dict,
    quant: QuantPlan,
    tokenizer,
    dtype: torch.dtype,
    device: str | torch.device,
    max_pixels: int = REFERENCE_MAX_PIXELS,
) -> VisionTower:
    """The checkpoint's vision tower (`visual.*`), streamed per tensor; a CheckpointError when it has none."""
    names = vision_keys([k for k in header if k not in quant.dropped])
    if not names:
        raise CheckpointError(path, vision_tower_problem(path) or "no vision tower")
    shapes = {n: tuple(quant.shape(k, header[k][1])) for k, n in names.items()}
    config = folder_vision_config(path) or infer_vision_config(shapes, path)
    with torch.device("meta"):
        model = Qwen3_5VisionModel(config)
    # the rotary table is a non-persistent buffer: built on the device, not read
    check_keys(path, expected_shapes(model), shapes)
    scales = quant.scales
    scale_values = dict(iter_tensors(path, keys=set(scales.values()))) if scales else {}
    for key, tensor in iter_tensors(path, keys=set(names)):
        if key in scales:  # an 8-bit file's vision tower: dequantized, the tower is small
            data, scale, group = quant.stored(key, tensor, scale_values[scales[key]])
            tensor = dequantize(data, scale, dtype, group)
        set_tensor(model, names[key], cast(tensor, dtype, device))
    rotary = type(model.rotary_pos_emb)(config).to(device)
    model.rotary_pos_emb = rotary
    if left := meta_leftovers(model):
        raise CheckpointError(path, f"nothing loaded these vision-tower tensors: {left}")
    return VisionTower(model, tokenizer, max_pixels)
