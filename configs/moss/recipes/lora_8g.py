"""Recipe lora_8g: LoRA on an 8 GB card, rank 16, 1 MP kohya data, text embeddings from the offline cache.


kohakumoss-config new --from lora_8g configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_8g.py")
use_config("../algo/lora.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "lora_8g"
STEPS = 2000
