"""A frozen linear over a weight stored in int8 (`kohakumoss_kernels.int8.Int8Weight`), no LoRA."""
