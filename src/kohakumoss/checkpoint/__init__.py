"""Checkpoint folders, below the trainer and the exporters (export/from_checkpoint.py rebuilds an adapter
from one): writing one (`write.py`), listing, pruning, verifying and resolving them (`folders.py`), reading
one back (`read.py`), the trainable weights (`state.py`) and random states (`rng.py`)."""
