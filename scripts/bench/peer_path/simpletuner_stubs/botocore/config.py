"""The one name SimpleTuner's helpers/data_backend/aws.py imports from botocore.config; never built."""


class Config:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError(
            "botocore.config.Config: the benchmark's botocore stand-in was used (the data must be local)"
        )
