"""The released layout: the HF `transformer/` checkpoint's keys, which are MossBackbone's own names.

Identity: `video_embedder`, `text_embedder.*`, `time_embedding.{0,2}`, `shared_block_modulation`,
`layers.N.{norm1,norm2,q_norm,k_norm}`, `layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}`, the head and
`rope.bands` (463 tensors for moss-image-5b). The key list agrees with mflux's
`moss_image_weight_mapping.py` and sglang's and moss-image-mlx's module names. A file that carries
ComfyUI's `model.diffusion_model.` / `diffusion_model.` prefix over these names (q, k, v not fused)
reads as this layout too.
"""

from .base import COMFY_PREFIXES, KeyLayout

LAYOUT = KeyLayout(
    name="hf",
    strip_prefixes=COMFY_PREFIXES,
    marker_keys=("layers.0.proj.q.weight",),
)
