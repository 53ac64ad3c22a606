"""Registry resolution, per-arch priority, skipping, runtime fallback and the tuning table, with fake backends."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import (
    OpSet,
    available_ops,
    priority_for,
    register_backend,
    register_op,
    registry,
    resolve,
    tuning,
)
from kohakumoss_kernels.op_list import shape_key
from kohakumoss_kernels.tuning.shape_keys import bucket

_ids = itertools.count()


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def lines():
    handler = Lines()
    logger = logging.getLogger("kohakumoss")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path))
    monkeypatch.delenv("KOHAKUMOSS_TUNE", raising=False)
    tuning._tables.clear()
    yield tmp_path
    tuning._tables.clear()


def fake_op(**backends):
    """A fresh op name whose eager doubles x (slowly: 2 ms), and the given fake backends (name -> fn); no
    generic compile backend (a test that wants one registers its own)."""
    op = f"fake_op_{next(_ids)}"
    register_op(op, slow_eager, compile=False)
    for name, fn in backends.items():
        register_backend(op, name, fn)
    return op


def slow_eager(x):
    import time

    time.sleep(0.002)
    return x * 2


def tagged(tag: str, fn=lambda x: x * 2, supports=None):
    calls = []

    def run(x):
        calls.append(tag)
        return fn(x)

    if supports is not None:
        run.supports = supports
    run.calls = calls
    return run


def test_priority_per_arch():
    # never run on their hardware: TileLang (sm70/sm75), Triton on XPU; only when named
    assert priority_for("sm70") == priority_for("xpu") == ("torch", "compile", "eager")
    for arch in ("sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"):
        assert priority_for(arch)[0] == "triton", arch
        assert priority_for(arch).index("compile") < priority_for(arch).index("eager")
    assert priority_for("cpu") == ("eager",)
    assert priority_for("sm61")[-1] == "eager"


def test_builtin_ops_resolve_on_cpu_to_eager_only():
    for op in (
        "rms_norm",
        "norm_modulate",
        "gated_residual",
        "apply_rope",
        "situ_glu",
        "varlen_attention",
        "qk_norm_rope",
        "residual_norm_modulate",
        "lora_linear",
    ):
        assert op in available_ops()
        assert resolve(op, "cpu", torch.float32).names == ["eager"]
    assert resolve("rms_norm", "cpu", torch.float32, backend="compile").names == ["compile", "eager"]


def test_candidates_follow_priority_and_torch_slot():
    names = registry.candidate_names("varlen_attention", "sm90")
    assert names[0] == "triton"
    assert names.index("sdpa_groups") < names.index("compile") < names.index("eager")
    assert "torch_varlen" in names
    assert registry.candidate_names("varlen_attention", "cpu") == ["eager"]
    assert "tilelang" not in registry.candidate_names("varlen_attention", "sm75")
    assert registry.candidate_names("varlen_attention", "sm75", "tilelang") == ["tilelang", "eager"]
    assert registry.candidate_names("rms_norm", "xpu", "triton")[0] == "triton"
    assert "triton" not in registry.candidate_names("rms_norm", "sm70")


def test_eager_backend_is_the_reference():
    ops = OpSet(backend="eager")
    x = torch.randn(5, 8)
    assert torch.equal(ops.rms_norm(x, None, 1e-6), registry.eager_op("rms_norm")(x, None, 1e-6))
    assert ops.bind("rms_norm", x.device, x.dtype).names == ["eager"]


def test_unknown_names_raise():
    with pytest.raises(KeyError, match="unknown op"):
        resolve("no_such_op", "sm90", torch.float16)
    with pytest.raises(ConfigError, match="unknown backend"):
        resolve("rms_norm", "sm90", torch.float16, backend="cuda_magic")
    with pytest.raises(ConfigError, match="KOHAKUMOSS_TUNE"):
        OpSet(tune="sometimes")


def test_unbuildable_backend_is_skipped_with_one_line(lines):
    def broken(arch, dtype):
        raise ImportError("no module named 'tilelang'")

    op = fake_op(tilelang=tagged("tl", supports=broken), triton=tagged("tr"))
    assert resolve(op, "sm75", torch.float16, backend="tilelang,triton").names == ["triton", "eager"]
    resolve(op, "sm75", torch.float16, backend="tilelang,triton")
    skipped = [m for m in lines if "tilelang" in m and "skipped" in m]
    assert len(skipped) == 1 and op in skipped[0]


def test_unsupported_dtype_skips_silently(lines):
    op = fake_op(triton=tagged("tr", supports=lambda arch, dtype: dtype != torch.float32))
    assert resolve(op, "sm90", torch.float32).names == ["eager"]
    assert resolve(op, "sm90", torch.float16).names == ["triton", "eager"]
    assert not lines


def test_runtime_error_falls_back_and_logs_once(lines):
    def boom(x):
        raise RuntimeError("CUDA error: too many resources requested")

    tr = tagged("tr", boom)
    cp = tagged("cp")
    op = fake_op(triton=tr, compile=cp)
    bound = resolve(op, "sm90", torch.float32, tune="off")
    x = torch.ones(3)
    for _ in range(3):
        assert torch.equal(bound(x), x * 2)
    assert tr.calls == ["tr"]  # demoted after its first failure
    assert cp.calls == ["cp"] * 3
    falls = [m for m in lines if "falling back" in m]
    assert len(falls) == 1 and "'compile'" in falls[0]


def test_a_kernel_that_does_not_compile_falls_back(lines):
    triton_errors = pytest.importorskip("triton.errors")

    def boom(x):
        raise triton_errors.TritonError("out of resource: shared memory")  # not a RuntimeError

    op = fake_op(triton=tagged("tr", boom), compile=tagged("cp"))
    bound = resolve(op, "sm90", torch.float32, tune="off")
    assert torch.equal(bound(torch.ones(3)), torch.ones(3) * 2)
    assert any("falling back" in m and "'compile'" in m for m in lines)


def test_which_errors_mean_try_the_next_backend():
    from kohakumoss_kernels.registry import backend_cannot_run

    tvm_error = type("InternalError", (Exception,), {"__module__": "tvm.error"})
    assert backend_cannot_run(RuntimeError("CUDA error")) and backend_cannot_run(tvm_error("layout"))
    assert not backend_cannot_run(TypeError("a bug in the caller")) and not backend_cannot_run(KeyError("k"))


def test_last_backend_error_propagates():
    op = fake_op()
    register_op(op, lambda x: (_ for _ in ()).throw(RuntimeError("bad shape")), compile=False)
    with pytest.raises(RuntimeError, match="bad shape"):
        resolve(op, "sm90", torch.float32)(torch.ones(2))


def test_opset_binds_per_device_and_dtype():
    op = fake_op()
    ops = OpSet(backend="auto", tune="off")
    getattr(ops, op)(torch.ones(2))
    getattr(ops, op)(torch.ones(2, dtype=torch.float64))
    assert len(ops._bound) == 2
    with pytest.raises(AttributeError):
        ops.not_an_op  # noqa: B018


def slow(tag, delay):
    import time

    def fn(x):
        time.sleep(delay)
        return x * 2

    return tagged(tag, fn)


def test_tune_table_times_inside_window_and_stores(cache, lines):
    fast, lazy = slow("fast", 0.0), slow("lazy", 0.003)
    op = fake_op(triton=lazy, compile=fast)
    ops = OpSet(backend="triton,compile", tune="table")
    x = torch.ones(300)
    getattr(ops, op)(x)  # outside the window: the first candidate, untimed
    assert lazy.calls == ["lazy"] and fast.calls == []
    with ops.tuning():
        getattr(ops, op)(x)
    said = [m for m in lines if m.startswith("kernel prewarm")]
    assert len(said) == 1 and "timed 1 new shape keys" in said[0] and "cpu.json" in said[0]
    with ops.tuning():  # nothing left to time: nothing said
        getattr(ops, op)(x)
    assert len([m for m in lines if m.startswith("kernel prewarm")]) == 1
    key = shape_key(op, x)
    table = json.loads((cache / "tuning" / "cpu.json").read_text())
    assert table["entries"][key]["backend"] == "compile"
    assert set(table["entries"][key]["ms"]) == {"triton", "compile", "eager"}
    n = len(lazy.calls)
    getattr(ops, op)(x)  # after the window: the stored winner, untimed
    assert len(lazy.calls) == n and fast.calls[-1] == "fast"


def test_tune_table_is_loaded_by_a_new_process(cache):
    op = fake_op(triton=slow("a", 0.003), compile=slow("b", 0.0))
    x = torch.ones(10)
    with tuning.tuning_window():
        getattr(OpSet(backend="triton,compile", tune="table"), op)(x)
    tuning._tables.clear()  # a new process: the table comes from disk
    a, b = tagged("a"), tagged("b")
    register_backend(op, "triton", a)
    register_backend(op, "compile", b)
    getattr(OpSet(backend="triton,compile", tune="table"), op)(x)
    assert b.calls == ["b"] and a.calls == []


def test_a_backend_added_since_the_row_was_stored_is_timed(cache):
    """A row timed before a backend existed (an upgrade added it) is timed again with it; a row that has
    seen every candidate, a failed one included, is used as stored."""
    op = fake_op(triton=slow("old", 0.003), compile=slow("new", 0.0))
    x = torch.ones(10)
    key = shape_key(op, x)
    table = tuning.table_for("cpu")
    table.put(key, "triton", {"triton": 0.1, "eager": 2.0})  # written before `compile` existed
    assert table.get(key, ["triton", "eager"]) == "triton"
    assert table.get(key, ["triton", "compile", "eager"]) is None
    with tuning.tuning_window():
        getattr(OpSet(backend="triton,compile", tune="table"), op)(x)
    assert table.get(key, ["triton", "compile", "eager"]) == "compile"
    table.put(key, "eager", {"eager": 2.0}, tried=["triton", "compile", "eager"])  # two failed to time
    assert table.get(key, ["triton", "compile", "eager"]) == "eager"
    assert table.entries[key]["tried"] == ["compile", "eager", "triton"]


def test_table_from_other_versions_is_ignored(cache, lines):
    path = cache / "tuning" / "cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"versions": {"torch": "0.0"}, "entries": {"k": {"backend": "triton"}}}))
    table = tuning.TuningTable(path)
    assert table.get("k") is None
    assert any("re-timing" in m for m in lines)


def test_a_shipped_table_fills_what_the_users_table_lacks(cache, monkeypatch, lines):
    """A fresh machine on a card this project timed starts from the shipped table (same versions only);
    the user's own rows win; KOHAKUMOSS_SHIPPED_TABLES=0 starts empty."""
    monkeypatch.delenv("KOHAKUMOSS_SHIPPED_TABLES", raising=False)  # tests/conftest.py turns them off
    op = fake_op(triton=slow("a", 0.003), compile=slow("b", 0.0))
    x = torch.ones(4)
    key = shape_key(op, x)
    shipped = cache / "shipped"
    shipped.mkdir()
    versions = tuning.software_versions()
    launch = {"config": [2, 4], "candidates": [[1, 4], [2, 4]], "us": {}}
    rows = {
        key: {"backend": "triton", "ms": {"triton": 0.1, "compile": 0.2, "eager": 2.0}},  # all candidates
        "other": {"backend": "eager", "ms": {"eager": 1.0}},
    }
    (shipped / "cpu.json").write_text(
        json.dumps({"versions": versions, "entries": rows, "launches": {"k": launch}})
    )
    monkeypatch.setattr(tuning, "SHIPPED_DIR", shipped)
    user = cache / "tuning" / "cpu.json"
    user.parent.mkdir()
    user.write_text(
        json.dumps({"versions": versions, "entries": {"other": {"backend": "compile", "ms": {}}}})
    )
    table = tuning.table_for("cpu")
    assert table.get(key) == "triton" and table.get("other") == "compile"  # the user's row wins
    assert table.get_launch("k", [(1, 4), (2, 4)]) == (2, 4)
    assert any("1 rows and 1 launch configs from" in m for m in lines)
    with tuning.tuning_window():  # the shipped row is used as it stands: nothing timed
        assert getattr(OpSet(backend="triton,compile", tune="table"), op)(x).tolist() == [2.0] * 4
    assert table.entries[key]["backend"] == "triton" and not any("prewarm" in m for m in lines)
    tuning._tables.clear()
    monkeypatch.setenv("KOHAKUMOSS_SHIPPED_TABLES", "0")
    assert tuning.table_for("cpu").get(key) is None
    tuning._tables.clear()
    monkeypatch.delenv("KOHAKUMOSS_SHIPPED_TABLES")
    (shipped / "cpu.json").write_text(json.dumps({"versions": {"torch": "0.0"}, "entries": rows}))
    assert tuning.table_for("cpu").get(key) is None  # timed under other versions: not used


def test_tune_off_never_times(cache):
    a, b = slow("a", 0.003), slow("b", 0.0)
    op = fake_op(triton=a, compile=b)
    with tuning.tuning_window():
        getattr(OpSet(backend="triton,compile", tune="off"), op)(torch.ones(4))
    assert a.calls == ["a"] and b.calls == []
    assert not (cache / "tuning").exists()


def test_tune_always_retimes_over_a_stored_choice(cache, monkeypatch):
    a, b = slow("a", 0.003), slow("b", 0.0)
    op = fake_op(triton=a, compile=b)
    x = torch.ones(4)
    tuning.table_for("cpu").put(shape_key(op, x), "triton", {"triton": 0.1})
    monkeypatch.setenv("KOHAKUMOSS_TUNE", "always")
    ops = OpSet(backend="triton,compile")
    assert ops.tune == "always"
    getattr(ops, op)(x)  # no window needed
    assert tuning.table_for("cpu").get(shape_key(op, x)) == "compile"


def test_timing_failure_excludes_candidate(cache, lines):
    def boom(x):
        raise RuntimeError("no kernel image")

    op = fake_op(triton=tagged("tr", boom), compile=tagged("cp"))
    with tuning.tuning_window():
        out = getattr(OpSet(backend="triton,compile", tune="table"), op)(torch.ones(4))
    assert torch.equal(out, torch.full((4,), 2.0))
    assert tuning.table_for("cpu").get(shape_key(op, torch.ones(4))) in ("compile", "eager")
    assert any("failed while timing" in m for m in lines)


def test_a_compiled_op_raising_any_error_is_skipped_while_timing(cache, lines, monkeypatch):
    """Inductor's generated code can fail with a NameError (torch 2.11, the joint attention at dynamic
    shapes); as the compile backend it is skipped and the run goes on with the next candidate."""
    import kohakumoss_kernels.backends.compile_utils as compile_utils

    def broken(x):
        raise NameError("name 's29' is not defined")

    monkeypatch.setattr(compile_utils.torch, "compile", lambda fn, dynamic=None: broken)
    op = fake_op(compile=compile_utils.compiled(slow_eager))
    with tuning.tuning_window():
        out = getattr(OpSet(backend="compile", tune="table"), op)(torch.ones(4))
    assert torch.equal(out, torch.full((4,), 2.0))
    assert tuning.table_for("cpu").get(shape_key(op, torch.ones(4))) == "eager"
    assert any("failed while timing" in m and "NameError" in m for m in lines)
    with pytest.raises(compile_utils.CompileFailed, match="NameError"):
        compile_utils.compiled(slow_eager)(torch.ones(2))


def test_a_compiled_op_lets_a_checkpoints_early_stop_through(monkeypatch):
    """Non-reentrant checkpointing ends its recomputation by raising through whatever op saved the last
    tensor; turned into CompileFailed, the registry fell back and torch failed with 'target_frame.early_stop
    is set' (a `low_vram` run on the H200)."""
    import torch.utils.checkpoint as checkpoint

    import kohakumoss_kernels.backends.compile_utils as compile_utils

    monkeypatch.setattr(compile_utils.torch, "compile", lambda fn, dynamic=None: fn)
    op = compile_utils.compiled(lambda t: t.sin() * 2)
    x = torch.randn(8, requires_grad=True)
    checkpoint.checkpoint(lambda t: op(op(t)), x, use_reentrant=False).sum().backward()
    ref = x.detach().requires_grad_(True)
    (2 * (2 * ref.sin()).sin()).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_timing_runs_backward_when_inputs_need_grad():
    seen = []

    def fn(x):
        seen.append(x.requires_grad)
        return x * 3

    x = torch.ones(4, requires_grad=True)
    tuning.time_call(fn, (x,), {}, rounds=1, calls=2)
    assert seen == [True, True, True] and x.grad is None


def test_shape_keys_bucket_tokens_and_keep_widths():
    assert bucket(1) == 64 and bucket(64) == 64 and bucket(65) == 128 and bucket(8704) == 16384
    x = torch.zeros(8704, 3072, dtype=torch.bfloat16)
    assert shape_key("rms_norm", x, None, 1e-6) == "rms_norm|bf16|T=16384|d=3072"
    q = torch.zeros(8704, 24, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4352, 8704], dtype=torch.int32)
    assert (
        shape_key("varlen_attention", q, q, q, cu, 4352)
        == "varlen_attention|bf16|T=16384|H=24|D=128|L=8192|B=2|r2"  # OpSpec.revision 2: earlier rows stale
    )


def test_a_revised_op_ignores_the_rows_stored_before_its_revision(cache, monkeypatch):
    from kohakumoss_kernels import op_list

    x = torch.zeros(100, 64)
    before = shape_key("rms_norm", x, None, 1e-6)
    tuning.table_for("cpu").put(before, "triton", {"triton": 0.1})
    revised = dataclasses.replace(op_list.SPECS["rms_norm"], revision=2)
    monkeypatch.setattr(op_list, "SPECS", {**op_list.SPECS, "rms_norm": revised})
    after = shape_key("rms_norm", x, None, 1e-6)
    assert after == before + "|r2" and tuning.table_for("cpu").get(after) is None


def test_decided_order_is_cached_until_a_backend_fails():
    fail = {"on": False}

    def flaky(x):
        if fail["on"]:
            raise RuntimeError("illegal memory access")
        return x * 2

    tr, cp = tagged("tr", flaky), tagged("cp")
    op = fake_op(triton=tr, compile=cp)
    bound = resolve(op, "sm90", torch.float32, tune="off")
    x = torch.ones(3)
    bound(x)
    assert len(bound._decided) == 1
    fail["on"] = True
    assert torch.equal(bound(x), x * 2)  # falls back, and the cached order is dropped
    assert bound.order(x)[0][0] == "compile"


def test_timing_under_no_grad_skips_the_backward():
    x = torch.ones(4, requires_grad=True)
    with torch.no_grad():
        assert tuning.time_call(lambda t: t * 3, (x,), {}, rounds=1, calls=1) >= 0


def test_device_timing_keeps_its_own_keys_and_asks_for_device_time(cache, monkeypatch):
    """A graphed run (OpSet.tuning(device_time=True)) chooses by device time, stored under '|graphed'."""
    asked = []

    def fake_time_call(fn, args, kwargs, device_time=False):
        asked.append(device_time)
        fn(*args, **kwargs)
        return 1.0 if fn is a else 2.0

    monkeypatch.setattr(tuning, "time_call", fake_time_call)
    a, b = tagged("a"), tagged("b")
    op = fake_op(triton=b, flex=a)
    ops = OpSet(backend="triton,flex", tune="table")
    x = torch.ones(10)
    getattr(ops, op)(x)  # bound before the switch: its wall-time choices must not carry over
    with ops.tuning(device_time=True):
        getattr(ops, op)(x)
    assert asked and all(asked)
    entries = json.loads((cache / "tuning" / "cpu.json").read_text())["entries"]
    assert (
        list(entries) == [shape_key(op, x) + "|graphed"]
        and entries[shape_key(op, x) + "|graphed"]["backend"] == "flex"
    )
    with pytest.raises(ConfigError, match="set_timing"):
        ops.set_timing("fast")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_timing_replays_a_graph_and_refuses_what_cannot_be_captured():
    x = torch.randn(1 << 20, device="cuda", requires_grad=True)
    assert tuning.time_call(lambda t: (t * 3).sin(), (x,), {}, device_time=True) > 0
    with pytest.raises(RuntimeError, match="not capturable"):
        tuning.time_call(lambda t: t * t.sum().item(), (x,), {}, device_time=True)
    assert tuning.time_call(lambda t: t * 2, (x,), {}, device_time=True) > 0  # the context still works


def test_lycoris_kernel_table_lives_in_our_cache(tmp_path, monkeypatch):
    """lycoris-lora reads LYCORIS_KERNEL_CACHE_DIR when it opens its table: ours unless the user set it."""
    from types import SimpleNamespace

    from lycoris.kernels.tuner import _table_path

    from kohakumoss_kernels.tuning import share_cache_with_lycoris

    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path / "ours"))
    monkeypatch.delenv("LYCORIS_KERNEL_CACHE_DIR", raising=False)
    assert share_cache_with_lycoris() == tmp_path / "ours" / "lycoris"
    h200 = SimpleNamespace(arch="sm90", name="NVIDIA H200")  # what _table_path reads of lycoris's DeviceInfo
    assert _table_path(h200).is_relative_to(tmp_path / "ours" / "lycoris")
    monkeypatch.setenv("LYCORIS_KERNEL_CACHE_DIR", str(tmp_path / "theirs"))
    assert share_cache_with_lycoris() == tmp_path / "theirs"


def test_lycoris_times_its_configs_only_inside_a_tuning_window(monkeypatch):
    """Its own default times a new key whenever met (mid-run too); ours: only in a window not 'off'."""
    from lycoris.kernels.plans import tune

    monkeypatch.setattr(tuning, "_LYCORIS_TUNE_SET_BY_USER", False)
    monkeypatch.setattr(tune, "_TUNING", None)
    monkeypatch.delenv("LYCORIS_KERNEL_TUNE", raising=False)
    assert tune.tuning_enabled()  # lycoris's default
    tuning.hold_lycoris_tuning()
    assert not tune.tuning_enabled()
    with tuning.tuning_window("table"):
        assert tune.tuning_enabled()
        with tuning.tuning_window("off"):
            assert not tune.tuning_enabled()
        assert tune.tuning_enabled()
    assert not tune.tuning_enabled()
    with OpSet(tune="off").tuning():
        assert not tune.tuning_enabled()
    with OpSet(tune="always").tuning():
        assert tune.tuning_enabled()

    monkeypatch.setattr(tuning, "_LYCORIS_TUNE_SET_BY_USER", True)  # the user's choice stands
    monkeypatch.setattr(tune, "_TUNING", None)
    monkeypatch.setenv("LYCORIS_KERNEL_TUNE", "on")
    with tuning.tuning_window("off"):
        assert tune.tuning_enabled()


def test_a_child_process_still_times_lycoris_in_its_windows():
    """The 'off' we put in the environment is inherited; the child must not take it for the user's."""
    code = (
        "from kohakumoss_kernels import tuning; from lycoris.kernels.plans import tune\n"
        "assert not tuning._LYCORIS_TUNE_SET_BY_USER and not tune.tuning_enabled()\n"
        "with tuning.tuning_window('table'): assert tune.tuning_enabled()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LYCORIS_KERNEL_TUNE"}
    env["LYCORIS_KERNEL_TUNE"], env["KOHAKUMOSS_HELD_LYCORIS_TUNE"] = "off", "1"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_out_of_memory_is_not_a_backend_failure(lines):
    """At call time it propagates (the plan does not fit; another backend would not make memory, and
    the fast one must not be dropped for the run); while timing, the candidate is skipped and the key is
    kept for this process only (a capped run must not decide for the card)."""

    def oom(x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    tr = tagged("tr", oom)
    op = fake_op(triton=tr, compile=tagged("cp"))
    bound = resolve(op, "sm90", torch.float32, tune="off")
    with pytest.raises(torch.OutOfMemoryError):
        bound(torch.ones(3))
    assert "triton" not in bound.failed and not [m for m in lines if "falling back" in m]

    fast = slow("fast", 0.0)
    op = fake_op(triton=tagged("tr2", oom), compile=fast)
    ops = OpSet(backend="triton,compile", tune="table")
    x = torch.ones(300)
    with ops.tuning():
        assert torch.equal(getattr(ops, op)(x), x * 2)
    assert any("ran out of memory while timing" in m for m in lines)
    assert not (tuning.table_for("cpu").entries.get(shape_key(op, x)))  # not stored
    n = len(fast.calls)
    getattr(ops, op)(x)
    assert len(fast.calls) == n + 1  # this process keeps the choice


def test_timing_inside_a_checkpointed_block_leaves_its_recomputation_intact(cache):
    """A candidate timed inside torch.utils.checkpoint's forward saves tensors the recomputation never
    saves: the timing runs outside the checkpoint's saved-tensor hooks, so the backward recomputes as
    the forward ran (it raised 'A different number of tensors was saved' and broke fresh-machine runs)."""
    from torch.utils.checkpoint import checkpoint

    op = fake_op(triton=tagged("a", torch.sin), compile=tagged("b", torch.cos))
    ops = OpSet(backend="triton,compile", tune="table")
    w = torch.randn(8, 8, requires_grad=True)

    def block(x):
        return getattr(ops, op)(x @ w).sin()

    x = torch.randn(4, 8, requires_grad=True)
    with ops.tuning():
        loss = checkpoint(block, x, use_reentrant=False).sum()
        loss.backward()
    expected = torch.autograd.grad(block(x).sum(), w)[0]
    assert torch.allclose(w.grad, expected)


def test_timing_inside_saved_tensor_hooks_packs_nothing_of_its_own(cache):
    """Memory engines (activation offload) pack saved tensors through hooks; the timing's own tensors
    must not reach them."""
    packed = []
    op = fake_op(triton=tagged("a", torch.sin), compile=tagged("b", torch.cos))
    ops = OpSet(backend="triton,compile", tune="table")
    x = torch.randn(4, 8, requires_grad=True)
    with ops.tuning(), torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = (getattr(ops, op)(x) * x).sum()
    assert len(packed) == 3  # the chosen backend's input and the multiply's two: nothing of the timing
    y.backward()


def test_a_spent_tuning_budget_leaves_keys_untimed_and_says_so(cache, lines, monkeypatch):
    monkeypatch.setenv(tuning.BUDGET_ENV, "0")
    lazy, fast = slow("lazy", 0.0), slow("fast", 0.0)
    op = fake_op(triton=lazy, compile=fast)
    ops = OpSet(backend="triton,compile", tune="table")
    with ops.tuning():
        getattr(ops, op)(torch.ones(4))
    assert lazy.calls == ["lazy"] and fast.calls == []  # the first backend, untimed
    assert tuning.table_for("cpu").get(shape_key(op, torch.ones(4))) is None
    assert any("budget was spent" in m for m in lines)


def test_device_lengths_keep_only_backends_that_read_lengths_on_the_device(cache, monkeypatch):
    """OpSet.set_lengths('device'): where an op has device-length backends only they are timed (under
    their own '|device_lengths' keys); the reference stays the untimed last resort."""
    timed = []

    def fake_time_call(fn, args, kwargs, device_time=False):
        timed.append(fn)
        return 1.0

    monkeypatch.setattr(tuning, "time_call", fake_time_call)
    host, dev, dev2 = tagged("host"), tagged("device"), tagged("device2")
    dev.device_lengths = dev2.device_lengths = True
    op = fake_op(sdpa_groups=host, triton=dev, torch_varlen=dev2)
    ops = OpSet(backend="sdpa_groups,triton,torch_varlen", tune="table")
    ops.set_lengths("device")
    x = torch.ones(10)
    with ops.tuning(device_time=True):
        getattr(ops, op)(x)
    assert timed == [dev, dev2]
    bound = ops.bind(op, x.device, x.dtype)
    assert [n for n, _ in bound.order(x)] == ["triton", "torch_varlen", "eager"]
    entries = json.loads((cache / "tuning" / "cpu.json").read_text())["entries"]
    assert list(entries) == [shape_key(op, x) + "|graphed|device_lengths"]
    with pytest.raises(ConfigError, match="set_lengths"):
        ops.set_lengths("sometimes")
