"""`AutoencoderKLFlux2` configs: the FLUX.2 one, a tiny one for tests, and inference from shapes.

Shapes fix every field but `norm_num_groups` and `batch_norm_eps` (FLUX.2 values, 32 and 1e-4, are
assumed; override them when a file differs). A decoder with other channels than the encoder
(ComfyUI's `flux2-vae_small`) becomes `decoder_block_out_channels`.
"""

from __future__ import annotations

import re
from typing import Any

from kohakumoss_common.errors import CheckpointError

FLUX2_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": [128, 256, 512, 512],
    "decoder_block_out_channels": None,
    "layers_per_block": 2,
    "latent_channels": 32,
    "norm_num_groups": 32,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "mid_block_add_attention": True,
    "batch_norm_eps": 1e-4,
}


def with_block_types(config: dict[str, Any]) -> dict[str, Any]:
    """Add the down/up block type tuples that match `block_out_channels`."""
    n = len(config["block_out_channels"])
    return {
        **config,
        "down_block_types": ["DownEncoderBlock2D"] * n,
        "up_block_types": ["UpDecoderBlock2D"] * n,
    }


def tiny_vae_config(small_decoder: bool = False) -> dict[str, Any]:
    """A few-hundred-thousand-parameter FLUX.2-shaped VAE (8x down, 32 latent channels) for tests."""
    config = {
        **FLUX2_VAE_CONFIG,
        "block_out_channels": [32, 64, 64, 64],
        "layers_per_block": 1,
        "decoder_block_out_channels": [32, 32, 32, 32] if small_decoder else None,
    }
    return with_block_types(config)


def _levels(shapes: dict[str, tuple[int, ...]], pattern: str) -> dict[int, int]:
    out = {}
    for key, shape in shapes.items():
        if m := re.match(pattern, key):
            out[int(m[1])] = shape[0]
    return dict(sorted(out.items()))


def _count(shapes: dict[str, tuple[int, ...]], pattern: str) -> int:
    return len({m[1] for k in shapes if (m := re.match(pattern, k))})


def infer_vae_config(shapes: dict[str, tuple[int, ...]], path: object = "<checkpoint>") -> dict[str, Any]:
    """The `AutoencoderKLFlux2` config of a checkpoint from its diffusers-named tensor shapes."""
    try:
        enc = _levels(shapes, r"^encoder\.down_blocks\.(\d+)\.resnets\.0\.conv2\.weight$")
        dec = _levels(shapes, r"^decoder\.up_blocks\.(\d+)\.resnets\.0\.conv2\.weight$")
        encoder_channels = list(enc.values())
        decoder_channels = list(reversed(dec.values()))
        enc_layers = _count(shapes, r"^encoder\.down_blocks\.0\.resnets\.(\d+)\.")
        dec_layers = _count(shapes, r"^decoder\.up_blocks\.0\.resnets\.(\d+)\.")
        config = {
            **FLUX2_VAE_CONFIG,
            "in_channels": shapes["encoder.conv_in.weight"][1],
            "out_channels": shapes["decoder.conv_out.weight"][0],
            "latent_channels": shapes["decoder.conv_in.weight"][1],
            "block_out_channels": encoder_channels or decoder_channels,
            "decoder_block_out_channels": decoder_channels if decoder_channels != encoder_channels else None,
            "layers_per_block": enc_layers or dec_layers - 1,
            "use_quant_conv": "quant_conv.weight" in shapes,
            "use_post_quant_conv": "post_quant_conv.weight" in shapes,
            "mid_block_add_attention": any(".mid_block.attentions.0." in k for k in shapes),
        }
    except KeyError as e:
        raise CheckpointError(path, f"cannot infer the VAE config: key {e} is missing") from e
    if enc and dec and len(enc) != len(dec):
        raise CheckpointError(path, f"encoder has {len(enc)} levels but decoder {len(dec)}; not a FLUX.2 VAE")
    if enc_layers and dec_layers and dec_layers != enc_layers + 1:
        raise CheckpointError(
            path,
            f"decoder has {dec_layers} resnets per level, expected {enc_layers + 1} (layers_per_block + 1)",
        )
    return with_block_types(config)
