"""The swiglu op."""
