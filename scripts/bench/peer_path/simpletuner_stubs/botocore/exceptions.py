"""The exception names SimpleTuner's helpers/data_backend/aws.py imports (caught only around S3 calls)."""


class NoCredentialsError(Exception):
    pass


class PartialCredentialsError(Exception):
    pass
