"""OPTIMIZER names: the named optimizers, where any of them (or a dotted `package.Class`) lives, and
kohya's `ss_optimizer` label (export/metadata.py writes it; optim/build.py builds the optimizer)."""

from __future__ import annotations

import importlib.util
import re

from kohakumoss_common.errors import ConfigError

# OPTIMIZER names -> (module, class, the pip package that provides it; None: torch itself)
NAMED_OPTIMIZERS: dict[str, tuple[str, str, str | None]] = {
    "adamw": ("torch.optim", "AdamW", None),
    "adafactor": ("torch.optim", "Adafactor", None),
    "adamw8bit": ("bitsandbytes.optim", "AdamW8bit", "bitsandbytes"),
    "paged_adamw8bit": ("bitsandbytes.optim", "PagedAdamW8bit", "bitsandbytes"),
    "paged_adamw": ("bitsandbytes.optim", "PagedAdamW", "bitsandbytes"),
    "lion8bit": ("bitsandbytes.optim", "Lion8bit", "bitsandbytes"),
    "paged_lion8bit": ("bitsandbytes.optim", "PagedLion8bit", "bitsandbytes"),
    "prodigy": ("prodigyopt", "Prodigy", "prodigyopt"),
    "schedulefree_adamw": ("schedulefree", "AdamWScheduleFree", "schedulefree"),
    "dadapt_adam": ("dadaptation", "DAdaptAdam", "dadaptation"),
}
OPTIMIZERS = tuple(NAMED_OPTIMIZERS)
DEFAULT_OPTIMIZER = "adamw"  # OPTIMIZER's default (config/train.py) and the builders' (optim/build.py)
# kohya's spellings (sd-scripts' --optimizer_type) whose letters differ from ours once case, '_' and '-'
# are ignored; every other name is matched that way too (AdamW8bit, PagedAdamW8bit, Lion8bit, DAdaptAdam)
KOHYA_SPELLINGS = {"adamwschedulefree": "schedulefree_adamw"}
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _letters(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


_BY_LETTERS = {**{_letters(n): n for n in NAMED_OPTIMIZERS}, **KOHYA_SPELLINGS}


def canonical_optimizer(name: str) -> str:
    """OPTIMIZER `name` as this project spells it: case, '_' and '-' ignored, kohya's names accepted
    ('AdamW8bit' -> 'adamw8bit'); a dotted `package.Class` and an unknown name come back unchanged."""
    if not isinstance(name, str) or _DOTTED.match(name):
        return name
    return _BY_LETTERS.get(_letters(name), name)


def optimizer_location(name: str) -> tuple[str, str, str | None]:
    """(module, class, pip package or None) of OPTIMIZER `name`: a named one or a dotted `package.Class`."""
    name = canonical_optimizer(name)
    if name in NAMED_OPTIMIZERS:
        return NAMED_OPTIMIZERS[name]
    if not _DOTTED.match(name):
        raise ConfigError("OPTIMIZER", f"'{name}' is not one of {OPTIMIZERS} nor a 'package.Class' name")
    module, cls = name.rsplit(".", 1)
    return module, cls, module.split(".")[0]


def optimizer_problem(name: str) -> str | None:
    """Why OPTIMIZER `name` cannot be built here (unknown, or its package is not installed), or None."""
    try:
        module, _, package = optimizer_location(name)
    except ConfigError as e:
        return e.args[-1] if e.args else str(e)
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        extra = (
            " (or pip install 'kohakumoss[optim]')" if canonical_optimizer(name) in NAMED_OPTIMIZERS else ""
        )
        return f"'{name}' needs the '{package}' package: pip install {package}{extra}"
    return None


def optimizer_label(name: str, args: dict | None = None, weight_decay: float = 0.0) -> str:
    """kohya's `ss_optimizer` form, `module.Class(key=value, ...)`, without importing the package."""
    try:
        module, cls, _ = optimizer_location(name)
    except ConfigError:
        module, cls = "", name
    kwargs = {"weight_decay": weight_decay, **(args or {})}
    inner = ",".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{module + '.' if module else ''}{cls}({inner})"
