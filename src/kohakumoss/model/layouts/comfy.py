"""The ComfyUI layout (diffusion_models/moss_image_*.safetensors): q, k, v fused into one qkv matrix.

Built from ComfyUI's conventions for single-stream DiTs (Lumina 2 / Z-Image style names, fused qkv,
optional 'model.diffusion_model.' prefix); NOT verified against the released Comfy-Org files, which
are not reachable from here. The fused order is q, k, v along the output dim.
"""

from .base import KeyLayout

LAYOUT = KeyLayout(
    name="comfy",
    renames=(
        ("img_in.weight", "x_embedder.weight"),
        ("img_in.bias", "x_embedder.bias"),
        ("txt_norm.weight", "cap_embedder.0.weight"),
        ("txt_in.weight", "cap_embedder.1.weight"),
        ("txt_in.bias", "cap_embedder.1.bias"),
        ("time_embed.linear_1.weight", "t_embedder.mlp.0.weight"),
        ("time_embed.linear_1.bias", "t_embedder.mlp.0.bias"),
        ("time_embed.linear_2.weight", "t_embedder.mlp.2.weight"),
        ("time_embed.linear_2.bias", "t_embedder.mlp.2.bias"),
        ("blocks.{i}.modulation.weight", "layers.{i}.adaLN_modulation.0.weight"),
        ("blocks.{i}.modulation.bias", "layers.{i}.adaLN_modulation.0.bias"),
        ("blocks.{i}.attn.o_proj.weight", "layers.{i}.attention.out.weight"),
        ("blocks.{i}.attn.q_norm.weight", "layers.{i}.attention.q_norm.weight"),
        ("blocks.{i}.attn.k_norm.weight", "layers.{i}.attention.k_norm.weight"),
        ("blocks.{i}.mlp.gate_up_proj.weight", "layers.{i}.feed_forward.w13.weight"),
        ("blocks.{i}.mlp.up_proj.weight", "layers.{i}.feed_forward.w1.weight"),
        ("blocks.{i}.mlp.down_proj.weight", "layers.{i}.feed_forward.w2.weight"),
        ("final.modulation.weight", "final_layer.adaLN_modulation.0.weight"),
        ("final.modulation.bias", "final_layer.adaLN_modulation.0.bias"),
        ("final.proj.weight", "final_layer.linear.weight"),
        ("final.proj.bias", "final_layer.linear.bias"),
    ),
    fused=(
        (
            (
                "blocks.{i}.attn.q_proj.weight",
                "blocks.{i}.attn.k_proj.weight",
                "blocks.{i}.attn.v_proj.weight",
            ),
            "layers.{i}.attention.qkv.weight",
        ),
        (
            ("blocks.{i}.attn.q_proj.bias", "blocks.{i}.attn.k_proj.bias", "blocks.{i}.attn.v_proj.bias"),
            "layers.{i}.attention.qkv.bias",
        ),
    ),
    strip_prefixes=("model.diffusion_model.", "diffusion_model."),
    marker_keys=("x_embedder.weight", "layers.0.attention.qkv.weight"),
)

# the fused groups, for exporters that repack adapter q/k/v into ComfyUI's fused qkv
QKV_FUSION = {"attn.qkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj")}
