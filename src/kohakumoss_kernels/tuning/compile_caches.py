"""The compilers' own caches in the user cache folder, so a run's compiled kernels survive it.

A first step on a fresh machine spends most of its time compiling Triton kernels (ours, and Inductor's for
the `compile` backends); Triton keeps them in ~/.triton/cache and Inductor in /tmp/torchinductor_<user>,
which a machine that is lent for one run, or a /tmp cleared at boot, loses. Pointing them under
`user_cache_dir()` puts every compiled kernel beside the tuning table that chose it: a later process (or a
machine that is handed that one folder) compiles nothing it compiled before. Each variable the user set
is left as it is; child processes inherit ours.
"""

from __future__ import annotations

import os
from pathlib import Path

from kohakumoss_common.paths import user_cache_dir

# variable -> folder under user_cache_dir(); read by each library when it first opens its cache
CACHE_DIRS = {
    "TRITON_CACHE_DIR": "triton",  # Triton's compiled kernels (Inductor's Triton kernels too)
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # Inductor's generated code, FX graph and AOTAutograd caches
    "TILELANG_CACHE_DIR": "tilelang",  # TileLang's compiled kernels
}
# torch.compile's on-disk caches of whole compiled graphs: on by default in recent torch; forced on here
# because a graph found there skips both tracing and code generation
CACHE_SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
_OURS_ENV = "KOHAKUMOSS_SET_COMPILE_CACHES"  # names the variables we set, for child processes to tell apart


def share_compile_caches(root: Path | None = None) -> dict[str, str]:
    """Set the compilers' cache variables the user did not set (to folders under `root`, default
    `user_cache_dir()`); returns every cache variable's value now. A variable set by us in a parent
    process (listed in KOHAKUMOSS_SET_COMPILE_CACHES) follows this process's cache folder."""
    root = Path(root) if root is not None else user_cache_dir()
    ours = set(filter(None, os.environ.get(_OURS_ENV, "").split(",")))
    wanted = {name: str(root / folder) for name, folder in CACHE_DIRS.items()} | CACHE_SWITCHES
    for name, value in wanted.items():
        if name not in os.environ or name in ours:
            os.environ[name] = value
            ours.add(name)
    os.environ[_OURS_ENV] = ",".join(sorted(ours))
    return {name: os.environ[name] for name in wanted}
