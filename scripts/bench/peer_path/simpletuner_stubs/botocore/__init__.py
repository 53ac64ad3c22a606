"""Import-only stand-in for botocore in SimpleTuner's benchmark process (README.md beside it)."""
