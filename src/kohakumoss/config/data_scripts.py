"""The knobs of the data scripts (scripts/data/*.py) as typed configs, one per script.

The dataset, scan, plan and cache-folder knobs are the training config's own sections (config/train.py:
`DatasetConfig`, `ScanConfig`, `PlanConfig`, `SeedConfig`, `CacheDirConfig`), so each has one default and
the caches these scripts fill are the ones a training run with the same values reads. The rest are the
scripts' own sections below.

One data config file serves all four scripts (`kohakumoss-config new data` writes it; kogine hands a
script every knob of its config), so a script checks its knobs against `DATA_SCHEMA`, the knobs of
`DataScriptsConfig` (every data script's sections), then reads its own typed config:
`CacheLatentsConfig.from_knobs(k).vae.vae_factory` (`run_data_script`); `call_factory` builds an
encoder from a factory knob, a wrong argument named by its knob. The knob reference,
docs/guides/data-knobs.md, is generated from these classes:
`python -m kohakumoss.config.data_scripts > docs/guides/data-knobs.md`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.knobs import Schema, run_checked
from kohakumoss_common.typed_config import ScriptConfig, config_knobs, knob, section
from kohakumoss_data import PlanKnobs
from kohakumoss_data.cache import SHARD_ITEMS
from kohakumoss_data.offline import LATENT_BATCH
from kohakumoss_data.sources.shards import ITEMS_PER_SHARD

from .reference import reference
from .train import CacheDirConfig, DatasetConfig, PlanConfig, ScanConfig, SeedConfig

# the sections the data scripts share with TrainConfig: their knobs must equal the training run's
TRAIN_SECTIONS = (DatasetConfig, ScanConfig, SeedConfig, PlanConfig, CacheDirConfig)


@dataclass(frozen=True)
class DataPlanConfig(PlanConfig, SeedConfig):
    """The training run's plan (SEED and the plan knobs), and how many of its epochs to inspect or cache."""

    epochs: int = knob(
        PlanKnobs.epochs,
        "epochs of the plan to inspect or cache (not the training run's EPOCHS, which may be 0: STEPS decides)",
        min=1,
    )
    micro_steps: int = knob(
        0,
        "the training run's micro-steps (STEPS x GRAD_ACCUM): plan at least the epochs they span, as the "
        "trainer does (0: EPOCHS alone)",
        min=0,
    )


@dataclass(frozen=True)
class CacheConfig(CacheDirConfig):
    """The cache the encoder scripts fill (cache_text, cache_latents)."""

    shard_items: int = knob(SHARD_ITEMS, "items per cache shard", min=1)
    batch_size: int = knob(LATENT_BATCH, "encoder batch size", min=1)


@dataclass(frozen=True)
class VaeScriptConfig:
    """The VAE cache_latents encodes with, and its image decoding."""

    vae_factory: str = knob("kohakumoss.encoders.vae:ImageVAE.load", "'module:callable' that returns the VAE")
    vae_kwargs: dict = knob({"path": "models/vae", "device": "cuda"}, "arguments of VAE_FACTORY")
    workers: int = knob(4, "image decode workers (not the training loader's WORKERS)", min=0)


@dataclass(frozen=True)
class TextScriptConfig:
    """The text encoder cache_text encodes with."""

    text_factory: str = knob("", "'module:callable' that returns the text encoder ('': the Qwen3.5 encoder)")
    text_kwargs: dict = knob(
        {"path": "models/text_encoder", "device": "cuda"},
        "arguments of TEXT_FACTORY (the Qwen3.5 encoder: TextEncoderConfig fields)",
    )


@dataclass(frozen=True)
class InspectReportConfig:
    """What inspect_data writes."""

    run_dir: str = knob("runs/inspect", "where report.txt, dropped.jsonl and the figures go")
    contact_items: int = knob(12, "planned crops on the contact sheet", min=0)


@dataclass(frozen=True)
class ShardsConfig:
    """What convert_shards writes."""

    out_dir: str = knob("data/shards", "output folder of the shards")
    max_area: int | None = knob(
        2048 * 2048,
        "shrink images above this pixel area (enough for any AREA up to 4 MP; None: keep the size)",
    )
    items_per_shard: int = knob(ITEMS_PER_SHARD, "images per shard", min=1)


@dataclass(frozen=True)
class InspectDataConfig(ScriptConfig):
    """Every knob of scripts/data/inspect_data.py."""

    dataset: DatasetConfig = section(DatasetConfig)
    scan: ScanConfig = section(ScanConfig)
    plan: DataPlanConfig = section(DataPlanConfig)
    report: InspectReportConfig = section(InspectReportConfig)


@dataclass(frozen=True)
class CacheTextConfig(ScriptConfig):
    """Every knob of scripts/data/cache_text.py."""

    dataset: DatasetConfig = section(DatasetConfig)
    scan: ScanConfig = section(ScanConfig)
    plan: DataPlanConfig = section(DataPlanConfig)
    cache: CacheConfig = section(CacheConfig)
    text: TextScriptConfig = section(TextScriptConfig)


@dataclass(frozen=True)
class CacheLatentsConfig(ScriptConfig):
    """Every knob of scripts/data/cache_latents.py."""

    dataset: DatasetConfig = section(DatasetConfig)
    scan: ScanConfig = section(ScanConfig)
    plan: DataPlanConfig = section(DataPlanConfig)
    cache: CacheConfig = section(CacheConfig)
    vae: VaeScriptConfig = section(VaeScriptConfig)


@dataclass(frozen=True)
class ConvertShardsConfig(ScriptConfig):
    """Every knob of scripts/data/convert_shards.py."""

    dataset: DatasetConfig = section(DatasetConfig)
    scan: ScanConfig = section(ScanConfig)
    shards: ShardsConfig = section(ShardsConfig)


@dataclass(frozen=True)
class DataScriptsConfig(ScriptConfig):
    """Every data script's sections: the knobs one data config may set (what `kohakumoss-config` checks)."""

    dataset: DatasetConfig = section(DatasetConfig)
    scan: ScanConfig = section(ScanConfig)
    plan: DataPlanConfig = section(DataPlanConfig)
    cache: CacheConfig = section(CacheConfig)
    vae: VaeScriptConfig = section(VaeScriptConfig)
    text: TextScriptConfig = section(TextScriptConfig)
    report: InspectReportConfig = section(InspectReportConfig)
    shards: ShardsConfig = section(ShardsConfig)


SCRIPT_CONFIGS: dict[str, type[ScriptConfig]] = {
    "inspect_data": InspectDataConfig,
    "cache_text": CacheTextConfig,
    "cache_latents": CacheLatentsConfig,
    "convert_shards": ConvertShardsConfig,
}
DATA_SCHEMA = Schema(config_knobs(DataScriptsConfig))
SHARED = tuple(k.name for cls in TRAIN_SECTIONS for k in config_knobs(cls))  # read from the training config


def run_data_script(
    config: type[ScriptConfig], module_globals: Mapping[str, Any], fn: Callable[[Any], None], script: str
) -> int:
    """Check a data script's knobs against DATA_SCHEMA (a shared data config may hold every data script's
    knobs, each checked), then run `fn` on the script's typed config; the exit status of `run_checked`."""
    own = [k.name for k in config_knobs(config)]  # --help lists this script's knobs only
    return run_checked(DATA_SCHEMA, module_globals, lambda k: fn(config.from_knobs(k)), script, own)


def call_factory(factory: Callable[..., Any], kwargs: Mapping[str, Any], knob: str) -> Any:
    """`factory(**kwargs)`, an argument it does not take (or a missing one) refused by `knob`'s name first."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(knob, f"{e} (arguments of {getattr(factory, '__qualname__', factory)})") from None
    except ValueError:  # no signature to check (a builtin): the call says what is wrong
        pass
    return factory(**kwargs)


HEADER = """# Data scripts' knobs (`scripts/data/*.py`)

Every knob of the data scripts, by section of their typed configs (`kohakumoss.config.data_scripts`: a
frozen dataclass per section, one field per knob: its type, default, bounds and help). This page is
generated from them: `python -m kohakumoss.config.data_scripts > docs/guides/data-knobs.md`.

The `dataset`, `scan` and `plan` sections (except `EPOCHS`) and `CACHE_DIR` are the training config's own
knobs ([train-knobs.md](train-knobs.md)): the same fields, so one default each. Give them the training
run's values, or the caches miss and the plan differs: `kohakumoss-config new train` writes a data
config that reads them from the training config ([configs.md](configs.md)). One data config serves
every script; each script checks all of its knobs before any work, and reads the sections below:

| script | sections |
| --- | --- |
{scripts}
"""


def reference_page() -> str:
    """docs/guides/data-knobs.md: the scripts' sections, then one table per section."""
    rows = [
        f"| `scripts/data/{name}.py` | {', '.join(f'`{f.name}`' for f in fields(cls))} |"
        for name, cls in SCRIPT_CONFIGS.items()
    ]
    return reference(DataScriptsConfig, HEADER.format(scripts="\n".join(rows)))


def main() -> None:
    print(reference_page(), end="")


if __name__ == "__main__":
    main()
