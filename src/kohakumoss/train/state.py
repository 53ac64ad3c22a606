"""The trainable weights of a run: defined in kohakumoss.checkpoint.state (below train and export)."""

from kohakumoss.checkpoint.state import load_trainable_state, trainable_state

__all__ = ["load_trainable_state", "trainable_state"]
