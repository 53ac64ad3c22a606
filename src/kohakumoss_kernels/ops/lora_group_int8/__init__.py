"""The lora_group op over frozen weights stored in int8 (`kohakumoss_kernels.int8.Int8Weight`)."""
