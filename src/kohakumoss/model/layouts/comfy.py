"""The ComfyUI layout (Comfy-Org/MOSS-Image `diffusion_models/moss_image_*.safetensors`).

The released names, except that each block's q, k and v are one matrix `layers.N.proj.qkv.weight`
[3d, d], rows q; k; v. Keys may carry `model.diffusion_model.` or `diffusion_model.`; KohakuMoss writes
`model.diffusion_model.` (what ComfyUI's own checkpoint saver writes). From the project's facts file
(public descriptions of the Comfy-Org files); the released file headers were not readable here.
"""

from .base import COMFY_PREFIXES, KeyLayout

QKV = ("layers.{i}.proj.q.weight", "layers.{i}.proj.k.weight", "layers.{i}.proj.v.weight")

LAYOUT = KeyLayout(
    name="comfy",
    fused=((QKV, "layers.{i}.proj.qkv.weight"),),
    strip_prefixes=COMFY_PREFIXES,
    save_prefix=COMFY_PREFIXES[0],
    marker_keys=("layers.0.proj.qkv.weight",),
)
