"""Algorithm layer: BOFT (butterfly OFT); RANK is the butterfly block factor.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "boft"
RANK = 4
LR = 0.0001
