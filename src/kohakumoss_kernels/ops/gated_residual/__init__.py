"""The gated_residual op."""
