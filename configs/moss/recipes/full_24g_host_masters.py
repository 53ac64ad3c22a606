"""Recipe full_24g_host_masters: Full fine-tune on a 24 GB card, fp32 master weights kept in host memory.

MEMORY_PROFILE 'auto' (the GPU layer's) picks the fastest plan that fits: for moss-image-5b at one 1 MP
image per step on a 24 GB card, every block checkpointed, the gradients summed on the host (GRAD_OFFLOAD)
and the fp32 masters and optimizer states in host RAM, streamed to the card for the update
(OPTIMIZER_PLACEMENT 'stream'); `kohakumoss-config profiles --gpu-mem 24 --algo full --tokens 4352`
lists it. Measured on an H200 under a 24 GiB cap (random weights, synthetic encoders; README, docs/
performance/training.md): 863 tokens/s at a 12.5 GiB peak. Host RAM: about 65 GB (derived, not measured:
fp32 masters, their gradient sums, the optimizer states).

    kohakumoss-config new --from full_24g_host_masters configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_24g.py")
use_config("../algo/full.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "full_24g_host_masters"
STEPS = 2000
EMA = False
TOKENS_PER_STEP = 4352  # one 1 MP image (4096 image tokens + 256 caption tokens) per step, as measured
