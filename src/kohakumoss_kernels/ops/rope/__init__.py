"""The rope op."""
