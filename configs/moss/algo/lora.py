"""Algorithm layer: LoRA (LyCORIS 'lora').

Starting values, not tuned on MOSS-Image.
"""

ALGO = "lora"
LR = 0.0001
