"""The lora_linear op over a frozen weight stored in float8 (`kohakumoss_kernels.fp8.Fp8Weight`)."""
