"""The rms_norm op."""
