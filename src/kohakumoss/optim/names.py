"""OPTIMIZER names: the named optimizers, where any of them (or a dotted `package.Class`) lives, and
kohya's `ss_optimizer` label (export/metadata.py writes it; train/optim.py builds the optimizer)."""

from __future__ import annotations

import importlib.util
import re

from kohakumoss_common.errors import ConfigError

# OPTIMIZER names -> (module, class, the pip package that provides it; None: torch itself)
NAMED_OPTIMIZERS: dict[str, tuple[str, str, str | None]] = {
    "adamw": ("torch.optim", "AdamW", None),
    "adafactor": ("torch.optim", "Adafactor", None),
    "adamw8bit": ("bitsandbytes.optim", "AdamW8bit", "bitsandbytes"),
    "prodigy": ("prodigyopt", "Prodigy", "prodigyopt"),
    "schedulefree_adamw": ("schedulefree", "AdamWScheduleFree", "schedulefree"),
}
OPTIMIZERS = tuple(NAMED_OPTIMIZERS)
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def optimizer_location(name: str) -> tuple[str, str, str | None]:
    """(module, class, pip package or None) of OPTIMIZER `name`: a named one or a dotted `package.Class`."""
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
        extra = " (or pip install 'kohakumoss[optim]')" if name in NAMED_OPTIMIZERS else ""
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
