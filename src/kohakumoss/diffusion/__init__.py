"""Flow matching: training sigmas, noise and velocity target, the loss; the released schedule and sampler."""

from .objective import FlowTarget, flow_matching_loss, make_flow_target
from .sampler import SamplerConfig, SamplerSpeed, euler_sample, initial_noise, released_uncond_skip_layers
from .schedule import released_sigmas
from .timestep import TimestepConfig, draw_sigmas

__all__ = [
    "FlowTarget",
    "SamplerConfig",
    "SamplerSpeed",
    "TimestepConfig",
    "draw_sigmas",
    "euler_sample",
    "flow_matching_loss",
    "initial_noise",
    "make_flow_target",
    "released_sigmas",
    "released_uncond_skip_layers",
]
