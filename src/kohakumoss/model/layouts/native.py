"""The native layout: the module names of kohakumoss.model.MossBackbone, unchanged."""

from .base import KeyLayout

LAYOUT = KeyLayout(
    name="native",
    renames=(),
    marker_keys=("img_in.weight", "blocks.0.attn.q_proj.weight"),
)
