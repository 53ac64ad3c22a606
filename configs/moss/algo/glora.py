"""Algorithm layer: GLoRA.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "glora"
LR = 0.0001
