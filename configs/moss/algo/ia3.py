"""Algorithm layer: IA3 (learned scales; RANK is ignored). Needs a higher LR than LoRA.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "ia3"
LR = 0.001
