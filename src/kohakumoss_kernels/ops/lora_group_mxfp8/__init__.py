"""The lora_group op over frozen weights stored in MXFP8 (`kohakumoss_kernels.mxfp8.Mxfp8Weight`)."""
