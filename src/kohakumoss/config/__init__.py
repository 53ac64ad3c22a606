"""Script knobs: their schemas (type, range, choices, help), validation, and preset-layer composition."""
