"""Recipe full_24g_host_masters: Full fine-tune on a 24 GB card, fp32 master weights kept in host memory.

Host masters: OPTIMIZER_PLACEMENT 'host' keeps the fp32 master weights and the optimizer states in
host RAM (updated by the CPU); the card holds bf16 weights, 32 of the 42 blocks streamed from pinned
host memory (profile 'low_vram'), and GRAD_OFFLOAD sends the grads to host fp32 sums through a small
staging ring. Predicted peak for moss-image-5b at 8704 tokens: ~7 GiB (`kohakumoss-config check`);
plan on 50-70 GiB of host RAM (fp32 masters, optimizer states, the bf16 copy). Not measured yet.

    kohakumoss-config new --from full_24g_host_masters configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_24g.py")
use_config("../algo/full.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "full_24g_host_masters"
STEPS = 2000
EMA = False
MEMORY_PROFILE = "low_vram"  # every block checkpointed, 32 blocks streamed, optimizer on the host
OPTIMIZER_PLACEMENT = "host"  # fp32 masters and optimizer states in host RAM
GRAD_OFFLOAD = True  # grads to host fp32 sums through a GPU staging ring
