"""Recipe lora_6g: LoRA on a 6 GB card, rank 16, 1 MP kohya data, latents and text embeddings from the offline caches.


kohakumoss-config new --from lora_6g configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_6g.py")
use_config("../algo/lora.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "lora_6g"
STEPS = 2000
