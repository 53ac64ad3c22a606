"""Multi-GPU training on torch.distributed, applied from outside the model.

launch.run(par, device, fn)   fn(device) on every worker, started here (elastic launcher) or by torchrun
launch.current() -> World     this rank, its world size and device
shard.shard_plan / rank_weight / step_noise    each rank's share of every micro-step
wrap.wrap_ddp / wrap_fsdp     DistributedDataParallel or FSDP2 around the backbone
materialize.sharded_backbone  fsdp: built on the meta device, only this rank's shards read or drawn
checkpoint.save_sharded / load_sharded          torch.distributed.checkpoint, any world size
gather.full_weights           rank 0 sees an FSDP2 model's whole weights (exports)
pipeline.PipelineEngine       pipeline: stages of blocks through torch.distributed.pipelining's schedules
threaded.ThreadedEngine       threaded: one process, a thread per stage on its own device
rank_run.RankRun              what the trainer asks of a ddp / fsdp / pipeline / threaded run
config.DistributedConfig      the knobs of several devices (TrainConfig.parallel) and their checks
"""

from .config import BUILT, MODES, check_knobs, devices_problem, mode_problem
from .launch import current, run
from .world import SINGLE, DistributedError, World

__all__ = [
    "BUILT",
    "MODES",
    "SINGLE",
    "DistributedError",
    "World",
    "check_knobs",
    "current",
    "devices_problem",
    "mode_problem",
    "run",
]
