"""One default per knob, in function signatures too: a parameter or record field that stands for a knob
either has no default (its callers pass the typed value) or reads the one record its knob reads
(`rank: int = AdapterSpec.rank`), never a second literal. `SITES` lists the places that once held a copy;
the scan finds a new one by its name and value."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import textwrap
from typing import Any

import pytest

from kohakumoss.adapters.builder import build_adapter
from kohakumoss.adapters.config import AdapterConfig
from kohakumoss.adapters.spec import AdapterSpec
from kohakumoss.config import sample as sample_config
from kohakumoss.config.data_scripts import CacheConfig, DataScriptsConfig, ShardsConfig
from kohakumoss.config.export import ExportScriptConfig
from kohakumoss.config.sample import SampleScriptConfig
from kohakumoss.config.train import ObjectiveConfig, OptimConfig, SampleConfig, TrainConfig
from kohakumoss.diffusion.generate import GenerationRequest
from kohakumoss.diffusion.objective import LossConfig, flow_matching_loss, loss_weight, token_error
from kohakumoss.diffusion.sampler import SamplerConfig, SamplerSpeed
from kohakumoss.diffusion.timestep import TimestepConfig, logit_normal_density
from kohakumoss.encoders.text_cap import report_cut_captions
from kohakumoss.export.bundle import export_all
from kohakumoss.export.from_checkpoint import export_checkpoint
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.optim.build import build_adapter_optimizer, build_full_ft_optimizer
from kohakumoss.train.components import build_backbone
from kohakumoss.train.ema import EMA
from kohakumoss.train.graphs import graph_refusal
from kohakumoss.train.schedule import LRSchedule
from kohakumoss.train.step import flow_loss
from kohakumoss_common.typed_config import config_knobs
from kohakumoss_data import LoaderKnobs, PlanKnobs, ScanKnobs
from kohakumoss_data.cache import TensorCache
from kohakumoss_data.caption_aug import augment_caption, drop_tags, shuffle_tags
from kohakumoss_data.encode import caption_embeddings
from kohakumoss_data.loader import open_caches, stop_pool
from kohakumoss_data.masks import planned_mask
from kohakumoss_data.offline import fill_latent_cache
from kohakumoss_data.resolution import target_size
from kohakumoss_data.sources.convert import convert_to_shards
from kohakumoss_data.sources.shards import ShardWriter
from kohakumoss_data.worker import ItemTask

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = (TrainConfig, SampleScriptConfig, ExportScriptConfig, DataScriptsConfig)
SETTINGS = (ScanKnobs, PlanKnobs, LoaderKnobs)  # the data package's settings: a field is the record
# the records whose literal default is the one a knob (or a settings field) reads; nothing else holds one
RECORDS = (
    AdapterSpec,
    GenerationRequest,
    LossConfig,
    SamplerConfig,
    SamplerSpeed,
    TimestepConfig,
    MemoryPlan,
    *SETTINGS,
)

# (where, parameter or field, the knob it stands for: (script config, KNOB) or (settings, field))
SITES: list[tuple[Any, str, tuple[type, str]]] = [
    *[
        (build_adapter, param, (TrainConfig, knob))
        for param, knob in [
            ("algo", "ALGO"), ("rank", "RANK"), ("alpha", "ALPHA"), ("preset", "TARGET_PRESET"),
            ("dropout", "DROPOUT"), ("rank_dropout", "RANK_DROPOUT"),
            ("module_dropout", "MODULE_DROPOUT"), ("bypass", "BYPASS"),
        ]
    ],
    (graph_refusal, "algo", (TrainConfig, "ALGO")),
    (graph_refusal, "module_dropout", (TrainConfig, "MODULE_DROPOUT")),
    (loss_weight, "min_snr_gamma", (TrainConfig, "MIN_SNR_GAMMA")),
    (token_error, "loss_type", (TrainConfig, "LOSS_TYPE")),
    (token_error, "huber_c", (TrainConfig, "HUBER_C")),
    *[
        (flow_matching_loss, param, (TrainConfig, knob))
        for param, knob in [
            ("weighting", "LOSS_WEIGHTING"), ("reduction", "LOSS_REDUCTION"), ("loss_type", "LOSS_TYPE"),
            ("huber_c", "HUBER_C"), ("min_snr_gamma", "MIN_SNR_GAMMA"),
        ]
    ],
    (flow_loss, "weighting", (TrainConfig, "LOSS_WEIGHTING")),
    (flow_loss, "reduction", (TrainConfig, "LOSS_REDUCTION")),
    (logit_normal_density, "mean", (TrainConfig, "LOGIT_MEAN")),
    (logit_normal_density, "std", (TrainConfig, "LOGIT_STD")),
    (export_all, "merged_layout", (ExportScriptConfig, "MERGED_LAYOUT")),
    (export_all, "save_format", (ExportScriptConfig, "SAVE_FORMAT")),
    (export_checkpoint, "merged_layout", (ExportScriptConfig, "MERGED_LAYOUT")),
    (export_checkpoint, "save_format", (ExportScriptConfig, "SAVE_FORMAT")),
    (export_checkpoint, "use_ema", (ExportScriptConfig, "USE_EMA")),
    (build_full_ft_optimizer, "optimizer", (TrainConfig, "OPTIMIZER")),
    (build_full_ft_optimizer, "use_muon", (TrainConfig, "USE_MUON")),
    (build_adapter_optimizer, "optimizer", (TrainConfig, "OPTIMIZER")),
    (build_backbone, "ops_backend", (TrainConfig, "OPS_BACKEND")),
    *[
        (LRSchedule, field, (TrainConfig, knob))
        for field, knob in [
            ("kind", "LR_SCHEDULE"), ("warmup_steps", "LR_WARMUP_STEPS"), ("min_ratio", "LR_MIN_RATIO"),
            ("cycles", "LR_CYCLES"), ("power", "LR_POWER"),
        ]
    ],
    (EMA.__init__, "decay", (TrainConfig, "EMA_DECAY")),
    (EMA.__init__, "warmup", (TrainConfig, "EMA_WARMUP")),
    (EMA.__init__, "every", (TrainConfig, "EMA_EVERY")),
    (report_cut_captions, "caption_format", (TrainConfig, "CAPTION_FORMAT")),
    (TensorCache.__init__, "shard_items", (DataScriptsConfig, "SHARD_ITEMS")),
    (open_caches, "shard_items", (DataScriptsConfig, "SHARD_ITEMS")),
    (stop_pool, "grace_s", (LoaderKnobs, "stop_grace_s")),
    (ShardWriter.__init__, "items_per_shard", (DataScriptsConfig, "ITEMS_PER_SHARD")),
    (convert_to_shards, "items_per_shard", (DataScriptsConfig, "ITEMS_PER_SHARD")),
    (fill_latent_cache, "workers", (LoaderKnobs, "workers")),
    (fill_latent_cache, "batch_size", (DataScriptsConfig, "BATCH_SIZE")),
    (planned_mask, "patch_px", (PlanKnobs, "patch_px")),
    (ItemTask, "patch_px", (PlanKnobs, "patch_px")),
    (target_size, "multiple", (PlanKnobs, "multiple")),
    (target_size, "min_aspect", (TrainConfig, "MIN_ASPECT")),
    (target_size, "max_aspect", (TrainConfig, "MAX_ASPECT")),
    (shuffle_tags, "separator", (PlanKnobs, "caption_separator")),
    (drop_tags, "separator", (PlanKnobs, "caption_separator")),
    (augment_caption, "separator", (PlanKnobs, "caption_separator")),
    (caption_embeddings, "write_back", (LoaderKnobs, "write_back")),
    (PlanKnobs, "caption_separator", (PlanKnobs, "caption_separator")),  # caption_aug.SEPARATOR
    (LoaderKnobs, "write_back", (LoaderKnobs, "write_back")),  # encode.WRITE_BACK
    # knob declarations that read a record below them
    *[
        (AdapterConfig, field, (TrainConfig, field.upper()))
        for field in ("algo", "rank", "alpha", "target_preset", "dropout", "rank_dropout", "module_dropout", "bypass")
    ],
    *[
        (ObjectiveConfig, field, (TrainConfig, field.upper()))
        for field in (
            "timestep_sampling", "logit_mean", "logit_std", "timestep_shift", "static_shift", "mode_scale",
            "loss_weighting", "loss_reduction", "min_snr_gamma", "loss_type", "huber_c",
        )
    ],
    (OptimConfig, "optimizer", (TrainConfig, "OPTIMIZER")),
    (OptimConfig, "use_muon", (TrainConfig, "USE_MUON")),
    *[
        (SampleConfig, field, (TrainConfig, field.upper()))
        for field in ("sample_cfg", "sample_shift", "sample_width", "sample_height")
    ],
    *[
        (sample_config.SamplerConfig, field, (SampleScriptConfig, field.upper()))
        for field in ("cfg", "steps", "width", "height", "shift", "uncond_skip_layers", "slg_start", "slg_stop", "cuda_graphs")
    ],
    (sample_config.SampleDeviceConfig, "stream_slots", (SampleScriptConfig, "STREAM_SLOTS")),
    (CacheConfig, "shard_items", (DataScriptsConfig, "SHARD_ITEMS")),
    (CacheConfig, "batch_size", (DataScriptsConfig, "BATCH_SIZE")),
    (ShardsConfig, "items_per_shard", (DataScriptsConfig, "ITEMS_PER_SHARD")),
]  # fmt: skip

# literal copies the scan finds that are another concept, each with why
EXEMPT = {
    "src/kohakumoss/cli/config_tool.py:NewRequest.algo": "the wizard's layer file, configs/train/algo/lora.toml",
    "src/kohakumoss/memory/estimate.py:block_weight_bytes.base_precision": "'same': unquantized linears, the "
    "function's plain case (a full fine-tune's, whatever BASE_PRECISION says)",
    "src/kohakumoss/memory/engines/checkpointing.py:CheckpointPolicy.every": "every block (the policy's plain "
    "case), not EMA_EVERY or LOG_EVERY",
    "src/kohakumoss/train/runner.py:__init__.accum": "one micro-step per update, the runner's plain case; the "
    "trainer passes GRAD_ACCUM",
    **{
        f"src/kohakumoss_kernels/registry.py:{fn}.backend": "the registry's own policy name (kohakumoss_kernels "
        "cannot read kohakumoss's config); OPS_BACKEND hands its value over"
        for fn in ("candidate_names", "resolve", "__init__")
    },
}
# a default that turns a feature off (or leaves it empty) says nothing about a knob's chosen value
NEUTRAL = (None, False, 0, 0.0, "", "none", (), [], {})


def declared(owner: type, name: str) -> Any:
    """The default of a script config's knob NAME, or of a settings record's field."""
    if owner in CONFIGS:
        return next(k.default for k in config_knobs(owner) if k.name == name)
    return next(f.default for f in dataclasses.fields(owner) if f.name == name)


def default_node(where: Any, name: str) -> ast.expr | None:
    """The source expression of `name`'s default in a function's signature or a class body (a knob's: its
    first argument), None without one."""
    node = ast.parse(textwrap.dedent(inspect.getsource(where))).body[0]
    if isinstance(node, ast.ClassDef):
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and statement.target.id == name:
                value = statement.value
                is_knob = isinstance(value, ast.Call) and getattr(value.func, "id", "") == "knob"
                return value.args[0] if is_knob else value
        raise AssertionError(f"{where.__name__} has no field {name}")
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults))
    defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    assert name in [a.arg for a in (*positional, *args.kwonlyargs)], f"{where.__qualname__} has no {name}"
    return defaults.get(name)


def is_literal(node: ast.expr) -> bool:
    """A value written out (1024, 'lora', 1024 * 1024, (22,)), not read from a name."""
    return not any(isinstance(n, (ast.Name, ast.Attribute, ast.Call)) for n in ast.walk(node))


def runtime_default(where: Any, name: str) -> Any:
    if inspect.isclass(where):
        field = next(f for f in dataclasses.fields(where) if f.name == name)
        if field.metadata.get("kohakumoss.knob"):
            return field.metadata["kohakumoss.knob"]["default"]
        return field.default
    return inspect.signature(where).parameters[name].default


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b and type(a) is type(b) or (isinstance(a, float) and isinstance(b, float) and a == b)


@pytest.mark.parametrize(
    "where, name, knob", SITES, ids=[f"{getattr(w, '__qualname__', w)}.{n}" for w, n, _ in SITES]
)
def test_a_site_of_a_knob_has_no_literal_default_and_reads_the_knobs_value(where, name, knob):
    node = default_node(where, name)
    if node is None:
        return  # no default: the callers pass the typed value
    assert not is_literal(node), (
        f"{where.__qualname__}({name}={ast.unparse(node)}): a second literal of {knob[1]}; read the record "
        f"its knob reads (e.g. {knob[0].__name__}) or drop the default"
    )
    assert _same(runtime_default(where, name), declared(*knob)), (where, name, knob)


def literal_copies(root: pathlib.Path = ROOT) -> list[str]:
    """'file:Owner.name' of every literal, non-neutral parameter or field default under src/ whose name is
    a knob's field (or its last words: `decay` of EMA_DECAY) and whose value is that knob's default,
    outside RECORDS."""
    defaults: dict[str, list] = {}
    for config in CONFIGS:
        for k in config_knobs(config):
            defaults.setdefault(k.name.lower(), []).append(k.default)
    for settings in SETTINGS:
        for f in dataclasses.fields(settings):
            defaults.setdefault(f.name, []).append(f.default)
    records = {cls.__name__ for cls in RECORDS}
    out = []
    for path in sorted((root / "src").rglob("*.py")):
        for owner in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = owner.args
                positional = args.posonlyargs + args.args
                pairs = [
                    *zip(positional[len(positional) - len(args.defaults) :], args.defaults),
                    *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None),
                ]
                named = [(a.arg, d) for a, d in pairs]
            elif isinstance(owner, ast.ClassDef) and owner.name not in records:
                named = [
                    (s.target.id, s.value)
                    for s in owner.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None
                ]
            else:
                continue
            for name, node in named:
                if not is_literal(node):
                    continue
                value = eval(compile(ast.Expression(node), str(path), "eval"), {"__builtins__": {}})
                if any(_same(value, n) for n in NEUTRAL):
                    continue
                fields = [f for f in defaults if f == name or f.endswith(f"_{name}")]
                if any(_same(value, d) for f in fields for d in defaults[f]):
                    out.append(f"{path.relative_to(root).as_posix()}:{owner.name}.{name}")
    return out


def test_no_function_or_record_repeats_a_knobs_default_as_a_literal():
    found = literal_copies()
    copies = [c for c in found if c not in EXEMPT]
    assert not copies, f"a knob's default written again (read its record, or say why in EXEMPT): {copies}"
    stale = set(EXEMPT) - set(found)
    assert not stale, f"EXEMPT lists copies that are gone: {sorted(stale)}"


def test_the_checks_see_a_reintroduced_literal(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.py").write_text(
        "def f(rank: int = 16, rank_dropout: float = 0.0, alpha: float = AdapterSpec.alpha):\n    pass\n"
        "class Req:\n    huber_c: float = 0.1\n    steps: int = 7\n"
    )
    assert literal_copies(tmp_path) == ["src/x.py:f.rank", "src/x.py:Req.huber_c"]
    assert is_literal(ast.parse("1024 * 1024", mode="eval").body)
    assert not is_literal(ast.parse("list(Sampler.uncond_skip_layers)", mode="eval").body)
