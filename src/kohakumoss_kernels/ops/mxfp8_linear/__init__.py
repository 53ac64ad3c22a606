"""A frozen linear over a weight stored in MXFP8 (`kohakumoss_kernels.mxfp8.Mxfp8Weight`), no LoRA."""
