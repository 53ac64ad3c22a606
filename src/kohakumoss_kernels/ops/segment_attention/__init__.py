"""The segment_attention op."""
