"""The optimizers, below the trainer, the memory engines and the exporters: building them (`build.py`:
Muon + AdamW, the adapter's LoRA+ groups, OPTIMIZER), `CombinedOptimizer` (several torch optimizers as one)
and which members placed states can step (`combined.py`), the OPTIMIZER names with their labels (`names.py`)."""
