"""Algorithm layer: OFT (diagonal, LyCORIS 'diag-oft'); RANK is the block size.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "oft"
RANK = 32
LR = 0.0001
