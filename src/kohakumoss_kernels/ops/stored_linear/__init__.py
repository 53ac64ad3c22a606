"""A frozen linear over a stored (fp8 / int8 / MXFP8) weight, no LoRA: one op, backends per weight kind."""
