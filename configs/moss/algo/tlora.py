"""Algorithm layer: T-LoRA (SVD init, timestep-dependent rank mask).

Starting values, not tuned on MOSS-Image.
"""

ALGO = "tlora"
LR = 0.0001
