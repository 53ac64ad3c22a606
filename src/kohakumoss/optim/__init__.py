"""The optimizer parts below the trainer, the memory engines and the exporters: `CombinedOptimizer` (several
torch optimizers as one), which members placed states can step, and the OPTIMIZER names with their labels.
train/optim.py builds the optimizers from them."""
