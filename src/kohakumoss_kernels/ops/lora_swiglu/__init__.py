"""The lora_swiglu op: SwiGLU over a LoRA linear's fused gate/up output, the LoRA term added in the kernel."""
