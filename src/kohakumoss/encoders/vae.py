"""`ImageVAE`: the FLUX.2 VAE (diffusers `AutoencoderKLFlux2`) with the project's latent normalization.

`encode(pixels in [-1, 1]) -> normalized latents [B, 32, H/8, W/8]`, `decode(latents) -> pixels`.
Loads a diffusers folder (config.json + diffusion_pytorch_model.safetensors) or a single file in
diffusers or original BFL/ComfyUI names (config inferred from shapes), optionally with the decoder
(and post-quant conv) taken from a second file, e.g. ComfyUI's smaller decoder `flux2-vae_small`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLFlux2

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.hashing import sha256_json
from kohakumoss_common.io import iter_tensors, read_header, resolve_files
from kohakumoss_common.log import get_logger
from kohakumoss_common.quant import plan_quantization

from . import vae_layouts
from .identity import files_identity, module_identity
from .latents import denormalize_latents, normalize_latents
from .streaming import cast, check_keys, expected_shapes, meta_leftovers, set_tensor
from .vae_config import infer_vae_config, with_block_types

log = get_logger(__name__)
DOWNSCALE = 8
_DECODER_PREFIXES = ("decoder.", "post_quant_conv.")
_OPTIONAL = {"bn.num_batches_tracked"}


class _Source:
    """One safetensors source in diffusers names: its files, renamed shapes and tensor reader."""

    def __init__(self, path: Path, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()):
        self.path = path
        self.files = resolve_files(path)
        header, metadata = read_header(path)
        self.quant = plan_quantization(path, header, rotations=True, metadata=metadata)
        dropped = self.quant.dropped
        keys = [k for k in header if k not in dropped]
        self.bfl = vae_layouts.is_bfl(keys)
        self.n_up = vae_layouts.count_up_levels(keys)
        self.names = {k: self._rename(k) for k in keys}
        if only is not None:
            self.names = {k: v for k, v in self.names.items() if v.startswith(only)}
        if skip:
            self.names = {k: v for k, v in self.names.items() if not v.startswith(skip)}
        self.shapes = {v: self._shape(v, header[k][1]) for k, v in self.names.items()}

    def _rename(self, key: str) -> str:
        return vae_layouts.bfl_to_diffusers(key, self.n_up) if self.bfl else key

    def _shape(self, name: str, shape: list[int]) -> tuple[int, ...]:
        return vae_layouts.bfl_shape(name, shape) if self.bfl else tuple(shape)

    def tensors(self):
        """Yield (diffusers key, tensor) one at a time, dequantized where the file is quantized."""
        scales = self.quant.scales
        scale_values = dict(iter_tensors(self.path, keys=set(scales.values()))) if scales else {}
        for key, tensor in iter_tensors(self.path, keys=set(self.names)):
            name = self.names[key]
            if key in scales:
                tensor = self.quant.dequantize(key, tensor, scale_values[scales[key]], torch.float32)
            yield name, vae_layouts.bfl_tensor(name, tensor) if self.bfl else tensor


def _build_meta(config: dict[str, Any]) -> AutoencoderKLFlux2:
    with torch.device("meta"):
        return AutoencoderKLFlux2.from_config(config)


def _folder_config(path: Path) -> dict[str, Any] | None:
    cfg = path / "config.json" if path.is_dir() else None
    if cfg is None or not cfg.exists():
        return None
    return {k: v for k, v in json.loads(cfg.read_text()).items() if not k.startswith("_")}


class ImageVAE:
    """FLUX.2 VAE wrapper: encode/decode with the latent normalization, fixed device and dtype."""

    def __init__(self, model: AutoencoderKLFlux2, weights_identity: str | None = None):
        self.model = model.eval().requires_grad_(False)
        self._weights_identity = weights_identity or module_identity(model)

    @classmethod
    def from_config(
        cls, config: dict[str, Any], dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> ImageVAE:
        """A randomly initialised VAE (tests, benchmarks)."""
        model = AutoencoderKLFlux2.from_config(with_block_types(config))
        for child in model.children():  # per child: ModelMixin.to(dtype) warns; bn stats stay float32
            child.to(device, torch.float32 if child is model.bn else dtype)
        return cls(model)

    @classmethod
    def load(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        small_decoder: str | Path | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> ImageVAE:
        """Load from a diffusers folder or a single file; `small_decoder` replaces the decoder weights."""
        path = Path(path)
        main = _Source(path, skip=_DECODER_PREFIXES if small_decoder is not None else ())
        sources = [main]
        if small_decoder is not None:
            sources.append(_Source(Path(small_decoder), only=_DECODER_PREFIXES))
        shapes = {k: v for s in sources for k, v in s.shapes.items()}
        folder = _folder_config(path) if small_decoder is None else None
        config = with_block_types({**(folder or infer_vae_config(shapes, path)), **(overrides or {})})
        model = _build_meta(config)
        check_keys(path, expected_shapes(model), shapes, optional=_OPTIONAL)
        for source in sources:
            for name, tensor in source.tensors():
                set_tensor(model, name, _convert(name, tensor, dtype, device))
        if "bn.num_batches_tracked" not in shapes:
            set_tensor(model, "bn.num_batches_tracked", torch.zeros((), dtype=torch.long, device=device))
        if left := meta_leftovers(model):
            raise CheckpointError(path, f"nothing loaded these tensors: {left}")
        files = [f for s in sources for f in s.files]
        log.info("VAE loaded from %s (%s layout)", path, "BFL" if main.bfl else "diffusers")
        return cls(model, weights_identity=files_identity(files))

    @property
    def device(self) -> torch.device:
        return self.model.decoder.conv_in.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.decoder.conv_in.weight.dtype

    @property
    def latent_channels(self) -> int:
        return self.model.config.latent_channels

    @property
    def identity(self) -> str:
        """sha256 of the config and the weights' content: a cache key for latents."""
        config = {k: v for k, v in self.model.config.items() if not k.startswith("_")}
        return sha256_json({"vae": "AutoencoderKLFlux2", "config": config, "weights": self._weights_identity})

    def _stats(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        bn = self.model.bn
        return bn.running_mean, bn.running_var, self.model.config.batch_norm_eps

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        return normalize_latents(raw, *self._stats())

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        return denormalize_latents(latents, *self._stats())

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] (H, W multiples of 16) -> normalized latents [B, C, H/8, W/8].

        The posterior mean is used (as diffusers' Flux2 pipeline does) unless a `generator` asks for a sample.
        """
        _check_pixels(pixels)
        dist = self.model.encode(pixels.to(self.device, self.dtype)).latent_dist
        raw = dist.mode() if generator is None else dist.sample(generator)
        return self.normalize(raw.float())

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents [B, C, h, w] -> pixels [B, 3, 8h, 8w] in [-1, 1] (float32, clamped)."""
        raw = self.denormalize(latents.float())
        pixels = self.model.decode(raw.to(self.device, self.dtype)).sample
        return pixels.float().clamp(-1, 1)


def _convert(name: str, tensor: torch.Tensor, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    # the normalization statistics stay float32 whatever the weights' dtype
    return cast(tensor, torch.float32 if name.startswith("bn.") else dtype, device)


def _check_pixels(pixels: torch.Tensor) -> None:
    if pixels.dim() != 4 or pixels.shape[1] != 3:
        raise ValueError(f"pixels must be [B, 3, H, W], got {list(pixels.shape)}")
    if pixels.shape[2] % (2 * DOWNSCALE) or pixels.shape[3] % (2 * DOWNSCALE):
        raise ValueError(f"pixel height and width must be multiples of 16, got {list(pixels.shape[2:])}")
