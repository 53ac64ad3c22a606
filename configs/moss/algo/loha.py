"""Algorithm layer: LoHa (Hadamard product of two low-rank pairs).

Starting values, not tuned on MOSS-Image.
"""

ALGO = "loha"
LR = 0.0002
