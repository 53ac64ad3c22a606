"""Algorithm layer: DyLoRA; RANK must be a multiple of block_size.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "dylora"
ALGO_ARGS = {"block_size": 4}
LR = 0.0001
