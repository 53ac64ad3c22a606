"""Algorithm layer: LoCon. MOSS-Image's DiT has only linear layers, so LoCon trains the same matrices as LoRA.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "locon"
LR = 0.0001
