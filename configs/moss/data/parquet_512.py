"""Data layer: parquet files (image and caption columns), target area 512 x 512, native aspect kept.

DATASET's path is a placeholder: your own config sets DATASET in full.
"""

DATASET = {"kind": "parquet", "path": "data/train"}
AREA = 262144  # 512 x 512 pixels
SAMPLE_WIDTH = 512
SAMPLE_HEIGHT = 512
MIN_SIDE = 256  # smaller images would be upscaled more than 2x
