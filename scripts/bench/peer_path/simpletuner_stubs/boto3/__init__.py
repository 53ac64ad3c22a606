"""Import-only stand-in for boto3 in SimpleTuner's benchmark process (README.md beside it): only its S3
data backend calls it, and the benchmark's data is a local folder; any use raises."""


def __getattr__(name: str):
    raise RuntimeError(f"boto3.{name}: the benchmark's boto3 stand-in was used (the data must be local)")
