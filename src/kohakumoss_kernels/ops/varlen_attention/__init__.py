"""The varlen_attention op."""
