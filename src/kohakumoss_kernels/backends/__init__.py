"""What the backends in `ops/<op>/` share: `triton_utils.py` (support, launch sizes, the launch-config
picker), `pdl.py`, `stream.py`, `row_chunks.py` and `sample_sums.py` (Triton building blocks),
`tilelang_utils.py`, `compile_utils.py` (the torch.compile backend) and `per_token.py` (the one-hot form)."""
