"""The lora_group op over frozen weights stored in float8 (`kohakumoss_kernels.fp8.Fp8Weight`)."""
