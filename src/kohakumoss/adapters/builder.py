"""build_adapter: wrap the backbone's selected linears with a LyCORIS network (lycoris-lora does the work)."""

from __future__ import annotations

import logging

import lycoris
from lycoris import LycorisNetwork, create_lycoris
from torch import nn

from kohakumoss.precision import Fp8Linear, Int8Linear, Mxfp8Linear
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger

from .algos import ALGOS, resolve_algo
from .dropouts import KNOBS, resolve_bypass
from .fast import route_through_ops
from .spec import AdapterSpec
from .targets import lycoris_preset, matched_modules, target_patterns

log = get_logger(__name__)


def build_from_spec(model: nn.Module, spec: AdapterSpec, quiet: bool = True) -> LycorisNetwork:
    """Freeze `model`, create the LyCORIS network for `spec`, apply it to the model and return it."""
    _, algo = resolve_algo(spec.algo)
    patterns, globs = target_patterns(spec.preset, spec.patterns)
    names = matched_modules(model, patterns, globs)
    if not names:
        raise ConfigError(
            "TARGET_PRESET", f"preset '{spec.preset}' {patterns} matches no nn.Linear of the model"
        )
    _check_bypass(spec, {**algo.fixed, **spec.algo_args})
    # a quantized base runs in bypass: lycoris forces it for fp8, but would run its merged-weight forward on
    # an Int8Linear's raw int8 values when asked for BYPASS=False
    forced = any(isinstance(model.get_submodule(n), (Fp8Linear, Int8Linear, Mxfp8Linear)) for n in names)
    values = {k: getattr(spec, k) for k in KNOBS}
    preferred = algo.bypass(spec.bypass, spec.algo_args)
    bypass = resolve_bypass(spec.algo, preferred, forced, values, auto=spec.bypass == "auto")
    if bypass != preferred and not forced:
        only = "bypass" if bypass else "merged-weight"
        log.info(
            f"{spec.algo}: dropout {values} acts only in lycoris's {only} forward; using it (BYPASS={bypass})"
        )
    model.requires_grad_(False)
    # create_lycoris reads its targets from class attributes; set them for this call
    LycorisNetwork.apply_preset(lycoris_preset(patterns, globs))
    kwargs = {
        "algo": algo.lycoris,
        "dropout": spec.dropout,
        "rank_dropout": spec.rank_dropout,
        "module_dropout": spec.module_dropout,
        "bypass_mode": bypass,
        **algo.fixed,
        **spec.algo_args,
    }
    level = lycoris.logger.level
    if quiet:
        lycoris.logger.setLevel(logging.WARNING)
    try:
        network = create_lycoris(
            model, spec.multiplier, linear_dim=spec.rank, linear_alpha=spec.alpha, **kwargs
        )
    except (ValueError, AssertionError) as e:
        raise ConfigError(
            "ALGO_ARGS", f"lycoris rejected {spec.algo} rank={spec.rank} {spec.algo_args}: {e}"
        ) from e
    finally:
        lycoris.logger.setLevel(level)
    if len(network.loras) != len(names):
        raise ConfigError(
            "TARGET_PRESET", f"lycoris wrapped {len(network.loras)} modules, expected {len(names)}"
        )
    network.apply_to()
    network.to(next(model.parameters()).device)
    ops = getattr(model, "ops", None)
    if ops is not None and ALGOS[spec.algo].project_kernels:  # the rest keep lycoris's forward
        route_through_ops(network, ops, model)
    network.requires_grad_(True)
    network.kohakumoss_spec = spec
    return network


def _check_bypass(spec: AdapterSpec, args: dict) -> None:
    """Refuse the combinations lycoris-lora 4.1.3 computes wrongly or cannot read back (instead of
    training them)."""
    if args.get("dora_wd") and str(args.get("wd_on_output", True)).lower() in ("false", "0"):
        raise ConfigError(
            "ALGO_ARGS",
            "DoRA with wd_on_output=False: lycoris's loader cannot read its file back (it sizes dora_scale "
            "per output row); leave wd_on_output at True",
        )
    if spec.bypass is not True:  # 'auto' never picks these (Algo.bypass)
        return
    if args.get("dora_wd"):
        raise ConfigError(
            "BYPASS", "lycoris ignores DoRA's weight decomposition (dora_wd) in bypass mode; use BYPASS=False"
        )
    if why := ALGOS[spec.algo].bypass_refused:
        raise ConfigError("BYPASS", f"{why}; use BYPASS=False")


def build_adapter(
    model: nn.Module,
    algo: str = AdapterSpec.algo,
    rank: int = AdapterSpec.rank,
    alpha: float = AdapterSpec.alpha,
    preset: str = AdapterSpec.preset,
    patterns: tuple[str, ...] = (),
    dropout: float = AdapterSpec.dropout,
    rank_dropout: float = AdapterSpec.rank_dropout,
    module_dropout: float = AdapterSpec.module_dropout,
    bypass: bool | str = AdapterSpec.bypass,
    multiplier: float = 1.0,
    **algo_args,
) -> LycorisNetwork:
    """Keyword form of `build_from_spec`; extra keywords go to lycoris (factor, block_size, constraint...)."""
    spec = AdapterSpec(
        algo=algo,
        rank=rank,
        alpha=alpha,
        preset=preset,
        patterns=tuple(patterns),
        dropout=dropout,
        rank_dropout=rank_dropout,
        module_dropout=module_dropout,
        bypass=bypass,
        multiplier=multiplier,
        algo_args=dict(algo_args),
    )
    return build_from_spec(model, spec)


def adapter_spec(network: LycorisNetwork) -> AdapterSpec | None:
    return getattr(network, "kohakumoss_spec", None)
