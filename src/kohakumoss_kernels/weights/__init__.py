"""The frozen weight kinds an op with a weight argument dispatches on: `stored_weight.py` (what every kind
shows of itself, `WEIGHT_KINDS`) and one module per quantized kind (`fp8.py` with its Triton passes in
`fp8_triton.py`, `int8.py`, `mxfp8.py`), each holding the quantizer and the two products a frozen linear needs."""
