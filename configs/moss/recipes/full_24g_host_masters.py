"""Recipe full_24g_host_masters: Full fine-tune on a 24 GB card, fp32 master weights kept in host memory.

Host masters (fp32 master weights and optimizer states in host RAM, bf16 weights on the card) are part
of the memory engines, which are NOT built yet: today this recipe keeps everything on the card and
needs far more than 24 GB (`kohakumoss-config check` shows the estimate).

    kohakumoss-config new --from full_24g_host_masters configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_24g.py")
use_config("../algo/full.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "full_24g_host_masters"
STEPS = 2000
EMA = False
