"""Dataset sources: kohya folders, plain folders, jsonl, parquet, webdataset tars and the project's shards."""

from .base import Source
from .concat import ConcatSource
from .factory import SOURCE_KINDS, make_source
from .folder import FolderSource
from .jsonl import JsonlSource
from .kohya import KohyaSource
from .parquet import ParquetSource
from .shards import ShardSource, ShardWriter
from .webdataset_source import WebDatasetSource

__all__ = [
    "SOURCE_KINDS",
    "ConcatSource",
    "FolderSource",
    "JsonlSource",
    "KohyaSource",
    "ParquetSource",
    "ShardSource",
    "ShardWriter",
    "Source",
    "WebDatasetSource",
    "make_source",
]
