"""Data layer: a plain folder of images with same-name caption files, target area 1 MP (1024 x 1024), native aspect kept.

DATASET's path is a placeholder: your own config sets DATASET in full.
"""

DATASET = {"kind": "folder", "path": "data/train"}
AREA = 1048576  # 1024 x 1024 pixels
SAMPLE_WIDTH = 1024
SAMPLE_HEIGHT = 1024
