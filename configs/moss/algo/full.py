"""Algorithm layer: Full fine-tune: Muon for hidden matrices, AdamW for the rest.

Starting values, not tuned on MOSS-Image.
"""

ALGO = "full"
LR = 1e-05
USE_MUON = True
WEIGHT_DECAY = 0.01
