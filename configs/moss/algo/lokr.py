"""Algorithm layer: LoKr (Kronecker product); factor 16.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "lokr"
LR = 0.0002
ALGO_ARGS = {"factor": 16}
