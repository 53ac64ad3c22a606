"""One folder per op: `eager.py` is the reference; other files are backends of the same signature."""
