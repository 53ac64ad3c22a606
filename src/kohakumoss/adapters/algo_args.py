"""ALGO_ARGS checked against what lycoris-lora takes, so that a misspelled key is refused, not ignored.

`create_lycoris(model, ..., **kwargs)` reads its options with `kwargs.get(name)` and drops any other
key without a word; its network hands them to the algorithm's module class, whose `__init__` names the
ones that algorithm uses. Both lists are read from the installed lycoris (its source and signatures).
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import textwrap

# create_lycoris options this project sets from its own knobs (an ALGO_ARGS entry would override them)
KNOB_OWNED = {
    "algo": "ALGO",
    "dropout": "DROPOUT",
    "rank_dropout": "RANK_DROPOUT",
    "module_dropout": "MODULE_DROPOUT",
    "bypass_mode": "BYPASS",
    "preset": "TARGET_PRESET",
    "linear_dim": "RANK",
    "linear_alpha": "ALPHA",
}
# create_lycoris option -> the name the module classes take it by (the rest keep their name)
_MODULE_NAME = {
    "dora_wd": "weight_decompose",
    "wd_on_output": "wd_on_out",
    "disable_conv_cp": "use_tucker",
    "use_cp": "use_tucker",
    "use_conv_cp": "use_tucker",
    "constrain": "constraint",
}
# options of the network rather than of an algorithm's module (every algorithm takes them)
_NETWORK = ("conv_dim", "conv_alpha", "train_norm", "train_llm_adapter")


@functools.cache
def lycoris_options() -> frozenset[str]:
    """The option names `create_lycoris` reads from its keyword arguments (and its deprecated aliases)."""
    from lycoris import wrapper

    tree = ast.parse(textwrap.dedent(inspect.getsource(wrapper.create_lycoris)))
    names = {
        call.args[0].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "get"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "kwargs"
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    }
    return frozenset(names | set(wrapper.deprecated_arg_dict))


@functools.cache
def module_options(lycoris_algo: str) -> frozenset[str]:
    """The keyword names the module class of a lycoris algo ('lora', 'lokr', 'diag-oft', ...) takes."""
    from lycoris.wrapper import network_module_dict

    return frozenset(inspect.signature(network_module_dict[lycoris_algo].__init__).parameters)


def unknown_args_problem(args: dict) -> str | None:
    """ALGO_ARGS keys that lycoris never reads, or that a knob sets (whatever the algorithm)."""
    if not isinstance(args, dict):
        return None
    known = sorted(lycoris_options() - set(KNOB_OWNED))
    out = []
    for key in args:
        if key in KNOB_OWNED:
            out.append(f"'{key}' is set by {KNOB_OWNED[key]}, not ALGO_ARGS")
        elif key not in lycoris_options():
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            out.append(f"'{key}' is not an option lycoris reads{hint}")
    if not out:
        return None
    return "; ".join(out) + f"; lycoris's options: {', '.join(known)}"


def algo_args_problem(algo: str, args: dict) -> str | None:
    """`unknown_args_problem`, then keys this ALGO's lycoris module does not take ('factor' with lora)."""
    from .algos import ALGOS, ALIASES

    if problem := unknown_args_problem(args):
        return problem
    name = ALIASES.get(str(algo).lower(), str(algo).lower())
    if name not in ALGOS or not args:
        return None  # 'full' takes no adapter; an unknown ALGO is named by its own check
    lycoris_algo = ALGOS[name].lycoris
    takes = module_options(lycoris_algo)
    unused = [k for k in args if k not in _NETWORK and _MODULE_NAME.get(k, k) not in takes]
    if not unused:
        return None
    users = sorted(
        n
        for n, a in ALGOS.items()
        if all(_MODULE_NAME.get(k, k) in module_options(a.lycoris) for k in unused)
    )
    where = f"; {', '.join(users)} take(s) them" if users else ""
    return f"ALGO '{name}' does not use {unused} (lycoris's {lycoris_algo} module ignores them){where}"
