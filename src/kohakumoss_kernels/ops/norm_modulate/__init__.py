"""The norm_modulate op."""
