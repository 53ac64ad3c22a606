"""Algorithm layer: DoRA (LoRA with weight decomposition).

Starting values, not tuned on MOSS-Image.
"""

ALGO = "dora"
LR = 0.0001
