"""The HF / diffusers-style transformer layout (transformer/diffusion_pytorch_model*.safetensors).

Built from diffusers' naming conventions for single-stream DiTs; NOT verified against the released
OpenMOSS-Team/MOSS-Image-Base files (not reachable from here). docs/guides/weights.md says so.
"""

from .base import KeyLayout

LAYOUT = KeyLayout(
    name="hf",
    renames=(
        ("img_in.weight", "x_embedder.weight"),
        ("img_in.bias", "x_embedder.bias"),
        ("txt_norm.weight", "context_embedder.0.weight"),
        ("txt_in.weight", "context_embedder.1.weight"),
        ("txt_in.bias", "context_embedder.1.bias"),
        ("time_embed.linear_1.weight", "time_embedder.linear_1.weight"),
        ("time_embed.linear_1.bias", "time_embedder.linear_1.bias"),
        ("time_embed.linear_2.weight", "time_embedder.linear_2.weight"),
        ("time_embed.linear_2.bias", "time_embedder.linear_2.bias"),
        ("blocks.{i}.modulation.weight", "transformer_blocks.{i}.norm1.linear.weight"),
        ("blocks.{i}.modulation.bias", "transformer_blocks.{i}.norm1.linear.bias"),
        ("blocks.{i}.attn.q_proj.weight", "transformer_blocks.{i}.attn.to_q.weight"),
        ("blocks.{i}.attn.k_proj.weight", "transformer_blocks.{i}.attn.to_k.weight"),
        ("blocks.{i}.attn.v_proj.weight", "transformer_blocks.{i}.attn.to_v.weight"),
        ("blocks.{i}.attn.q_proj.bias", "transformer_blocks.{i}.attn.to_q.bias"),
        ("blocks.{i}.attn.k_proj.bias", "transformer_blocks.{i}.attn.to_k.bias"),
        ("blocks.{i}.attn.v_proj.bias", "transformer_blocks.{i}.attn.to_v.bias"),
        ("blocks.{i}.attn.o_proj.weight", "transformer_blocks.{i}.attn.to_out.0.weight"),
        ("blocks.{i}.attn.q_norm.weight", "transformer_blocks.{i}.attn.norm_q.weight"),
        ("blocks.{i}.attn.k_norm.weight", "transformer_blocks.{i}.attn.norm_k.weight"),
        ("blocks.{i}.mlp.gate_up_proj.weight", "transformer_blocks.{i}.ff.net.0.proj.weight"),
        ("blocks.{i}.mlp.up_proj.weight", "transformer_blocks.{i}.ff.net.0.proj.weight"),
        ("blocks.{i}.mlp.down_proj.weight", "transformer_blocks.{i}.ff.net.2.weight"),
        ("final.modulation.weight", "norm_out.linear.weight"),
        ("final.modulation.bias", "norm_out.linear.bias"),
        ("final.proj.weight", "proj_out.weight"),
        ("final.proj.bias", "proj_out.bias"),
    ),
    marker_keys=("x_embedder.weight", "transformer_blocks.0.attn.to_q.weight"),
)
