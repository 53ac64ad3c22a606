"""The lora_linear op over a frozen weight stored in int8 (`kohakumoss_kernels.int8.Int8Weight`)."""
