"""Data layer: webdataset tar files (image + .txt per key), target area 1 MP (1024 x 1024), native aspect kept.

DATASET's path is a placeholder: your own config sets DATASET in full.
"""

DATASET = {"kind": "webdataset", "path": "data/train"}
AREA = 1048576  # 1024 x 1024 pixels
SAMPLE_WIDTH = 1024
SAMPLE_HEIGHT = 1024
