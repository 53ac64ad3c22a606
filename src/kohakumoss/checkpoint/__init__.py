"""Reading a checkpoint folder (`read.py`), the trainable weights (`state.py`) and random states (`rng.py`):
below the trainer (train/checkpoint.py writes, lists and resolves the folders) and the exporters
(export/from_checkpoint.py rebuilds an adapter from one)."""
