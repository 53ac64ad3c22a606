"""The lora_group op: several LoRA linears that read the same input (the attention's q, k and v)."""
