"""Recipe lokr_16g: LoKr (factor 16) on a 16 GB card, 1 MP kohya data.


kohakumoss-config new --from lokr_16g configs/user/my_run.py
"""

from kohakuengine import use_config

use_config("../gpu/vram_16g.py")
use_config("../algo/lokr.py")
use_config("../data/kohya_1mp.py")

RUN_NAME = "lokr_16g"
STEPS = 2000
