"""The residual_norm_modulate op: gated residual add fused with the next AdaLN input."""
