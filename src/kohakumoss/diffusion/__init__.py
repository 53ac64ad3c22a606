"""Flow matching: sigma sampling and shifts, noise and velocity target, the loss, the Euler CFG sampler."""

from .objective import FlowTarget, flow_matching_loss, make_flow_target
from .sampler import SamplerConfig, euler_sample, sigma_schedule
from .timestep import TimestepConfig, draw_sigmas

__all__ = [
    "FlowTarget",
    "SamplerConfig",
    "TimestepConfig",
    "draw_sigmas",
    "euler_sample",
    "flow_matching_loss",
    "make_flow_target",
    "sigma_schedule",
]
