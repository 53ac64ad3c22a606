"""What the code that runs the model opens or sets around op calls: `capture.py` (CUDA graph capture),
`host_values.py` (host copies of cu_seqlens), `cast_cache.py` (one cast of the fp32 masters per forward),
`grad_sink.py` (weight gradients written into `.grad` by their GEMM) and `deterministic.py` (DETERMINISTIC)."""
