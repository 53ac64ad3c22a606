"""Recipe lora_24g_bf16: LoRA on a 24 GB card in bf16, rank 32, 1 MP kohya data.


kohakumoss-config new --from lora_24g_bf16 configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_24g.py")
use_config("../algo/lora.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "lora_24g_bf16"
STEPS = 2000
