"""The lora_linear op: a linear layer plus its LoRA bypass, through lycoris-lora's fused kernels."""
