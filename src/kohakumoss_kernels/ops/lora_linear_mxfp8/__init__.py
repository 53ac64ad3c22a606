"""The lora_linear op over a frozen weight stored in MXFP8 (`kohakumoss_kernels.mxfp8.Mxfp8Weight`)."""
