"""What a first step on a card keeps for the next run: launch-config picks in the card's table (re-read, not
timed again; other versions, a corrupt file, several ranks), the compilers' caches under the user cache,
and which launch configs are worth timing at all (launch_prune), all with fake timings and cards."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kohakumoss_kernels import register_backend, register_op, resolve, tuning
from kohakumoss_kernels.backends import triton_utils
from kohakumoss_kernels.op_list import shape_key
from kohakumoss_kernels.tuning import launch_prune
from kohakumoss_kernels.tuning.compile_caches import share_compile_caches
from kohakumoss_kernels.tuning.launch_prune import CardLimits, drop_reason, prune

ROOT = Path(__file__).resolve().parents[2]
KEY = (3072, torch.bfloat16, 16384, torch.device("cpu"))
ROW = "demo.bwd|3072|torch.bfloat16|16384"
H100 = CardLimits(sm=90, warps_per_sm=64, shared_bytes=227 * 1024)
RTX4090 = CardLimits(sm=89, warps_per_sm=48, shared_bytes=99 * 1024)
TURING = CardLimits(sm=75, warps_per_sm=32, shared_bytes=64 * 1024)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def warnings():
    handler = Lines()
    logger = logging.getLogger("kohakumoss")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


@pytest.fixture
def picker(tmp_path, monkeypatch):
    """pick() on a fresh process's state with fake device timings: `timed` lists every config launched
    (each candidate's compile-and-time), `speed` gives each config's microseconds."""
    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path))
    monkeypatch.setenv(triton_utils.ENV_PICK, "1")
    monkeypatch.delenv("KOHAKUMOSS_TUNE", raising=False)
    monkeypatch.delenv(launch_prune.MAX_VARIANTS_ENV, raising=False)
    monkeypatch.setattr(tuning, "_tables", {})
    monkeypatch.setattr(triton_utils, "_PICKED", {})
    timed: list[tuple] = []
    speed: dict[tuple, float] = {}

    def device_ms(fn, reps=10, rounds=3):
        fn()
        return speed.get(timed[-1], 1.0) / 1e3

    monkeypatch.setattr(triton_utils, "device_ms", device_ms)

    def run(candidates, name="demo.bwd", key=KEY):
        return triton_utils.pick(name, key, candidates, timed.append)

    def new_process():
        monkeypatch.setattr(tuning, "_tables", {})
        monkeypatch.setattr(triton_utils, "_PICKED", {})
        timed.clear()

    run.timed, run.speed, run.new_process = timed, speed, new_process
    return run


def test_a_pick_is_kept_with_the_versions_and_reread_without_timing(picker, tmp_path):
    picker.speed.update({(1, 4, 2): 30.0, (2, 8, 2): 10.0, (1, 16, 1): 20.0})
    candidates = [(1, 4, 2), (2, 8, 2), (1, 16, 1)]
    assert picker(candidates) == (2, 8, 2) and set(picker.timed) == set(candidates)
    data = json.loads((tmp_path / "tuning" / "cpu.json").read_text())
    assert data["versions"] == tuning.software_versions() and "torch" in data["versions"]
    assert data["launches"][ROW]["config"] == [2, 8, 2]
    picker.new_process()
    assert picker(candidates) == (2, 8, 2) and picker.timed == []  # read back: nothing timed


def test_a_pick_timed_under_other_versions_is_timed_again(picker, tmp_path):
    path = tmp_path / "tuning" / "cpu.json"
    path.parent.mkdir(parents=True)
    launch = {"config": [1, 4], "candidates": [[1, 4], [2, 8]], "us": {}}
    path.write_text(json.dumps({"versions": {"torch": "0.0"}, "entries": {}, "launches": {ROW: launch}}))
    picker.speed.update({(1, 4): 9.0, (2, 8): 1.0})
    assert picker([(1, 4), (2, 8)]) == (2, 8) and picker.timed
    assert json.loads(path.read_text())["versions"] == tuning.software_versions()


def test_each_card_has_its_own_table(picker, tmp_path, monkeypatch):
    """The table is the device's (its name in the file name): a pick on one card is not another's."""
    monkeypatch.setattr(tuning, "card_name", lambda device: "NVIDIA_H200")
    picker.speed.update({(1, 4): 9.0, (2, 8): 1.0})
    picker([(1, 4), (2, 8)])
    picker.new_process()
    monkeypatch.setattr(tuning, "card_name", lambda device: "NVIDIA_H100_80GB_HBM3")
    picker([(1, 4), (2, 8)])
    assert picker.timed  # timed again on the other card
    assert {p.name for p in (tmp_path / "tuning").glob("*.json")} == {
        "NVIDIA_H200.json",
        "NVIDIA_H100_80GB_HBM3.json",
    }


def test_a_corrupt_table_is_ignored_with_a_warning_and_rewritten(picker, tmp_path, warnings):
    path = tmp_path / "tuning" / "cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"versions": {"torch": ')  # a run killed mid-write by an older version
    picker.speed.update({(1, 4): 9.0, (2, 8): 1.0})
    assert picker([(1, 4), (2, 8)]) == (2, 8) and picker.timed
    said = [r for r in warnings if "unreadable" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING and str(path) in said[0].getMessage()
    assert json.loads(path.read_text())["launches"][ROW]["config"] == [2, 8]


def test_a_table_of_the_wrong_shape_is_ignored(tmp_path, warnings):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"versions": tuning.software_versions(), "launches": ["not", "a", "dict"]}))
    table = tuning.TuningTable(path)
    assert table.launches == {} and any("unreadable" in r.getMessage() for r in warnings)


def test_a_stored_pick_answers_while_the_kernel_offers_no_new_config(tmp_path):
    """A pick timed among some of a kernel's configs (launch_prune) answers for that kernel's list, or a
    shorter one that still holds it; a config the kernel gained since makes it time again."""
    table = tuning.TuningTable(tmp_path / "cpu.json")
    offered = [(1, 4), (2, 8), (4, 8), (8, 8)]
    table.put_launch("k", (2, 8), [(2, 8), (4, 8)], {}, offered)
    assert table.get_launch("k", offered) == (2, 8)
    assert table.get_launch("k", [(2, 8), (1, 4)]) == (2, 8)
    assert table.get_launch("k", [(1, 4), (4, 8)]) is None  # the stored pick is not offered
    assert table.get_launch("k", [*offered, (16, 8)]) is None  # (16, 8) is new
    table.put_launch("old", (2, 8), [(1, 4), (2, 8)], {})  # an entry without "offered": all were timed
    assert table.get_launch("old", [(1, 4), (2, 8)]) == (2, 8)
    assert "offered" not in table.launches["old"]


def test_ranks_writing_one_table_keep_each_others_rows(tmp_path):
    """Two processes (ranks) time different keys into one card's table at once: every row survives."""
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from kohakumoss_kernels.tuning import TuningTable
        table = TuningTable(Path(sys.argv[1]))
        for i in range(40):
            table.put_launch(f"{sys.argv[2]}|{i}", (1, 4), [(1, 4)], {})
            table.put(f"{sys.argv[2]}|{i}", "triton", {"triton": 0.1})
        """
    )
    path = tmp_path / "tuning" / "cpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KOHAKUMOSS_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), f"rank{r}"], env=env) for r in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads(path.read_text())
    want = {f"rank{r}|{i}" for r in (0, 1) for i in range(40)}
    assert set(data["launches"]) == want and set(data["entries"]) == want


def test_a_second_table_object_takes_in_the_rows_on_disk(tmp_path):
    """A rank's save merges what another wrote since it loaded (its own newer rows win)."""
    path = tmp_path / "cpu.json"
    first, second = tuning.TuningTable(path), tuning.TuningTable(path)
    first.put("a", "triton", {"triton": 1.0})
    second.put("b", "eager", {"eager": 1.0})
    second.put("a", "compile", {"compile": 0.5})
    assert json.loads(path.read_text())["entries"]["a"]["backend"] == "compile"
    assert set(json.loads(path.read_text())["entries"]) == {"a", "b"}


# ---- which configs are timed


def test_programs_that_cannot_share_an_sm_are_not_timed():
    assert drop_reason("x.bwd", (1, 16, 4), KEY, RTX4090)  # 64 warps on a 48-warp SM
    assert drop_reason("x.bwd", (1, 32, 2), KEY, RTX4090)
    assert drop_reason("x.bwd", (1, 16, 2), KEY, RTX4090) is None
    assert drop_reason("x.bwd", (1, 16, 4), KEY, H100) is None  # 64 warps fit an sm90 SM
    assert drop_reason("x.fwd", (4, 16), KEY, RTX4090) is None  # a row kernel: no programs per SM


def test_stages_past_the_shared_memory_or_without_async_copies_are_not_timed():
    attn_key = (128, torch.bfloat16, 4096, torch.device("cpu"))
    # 2 buffered stages of a 128 x 128 K and V tile: 128 KiB, over a 99 KiB card, within an sm90's 227
    assert drop_reason("varlen_attention.fwd", (128, 128, 8, 3), attn_key, RTX4090)
    assert drop_reason("varlen_attention.fwd", (128, 128, 8, 3), attn_key, H100) is None
    assert drop_reason("varlen_attention.fwd", (128, 64, 4, 4), attn_key, H100) is None
    unknown = CardLimits(sm=86, warps_per_sm=48, shared_bytes=None)  # no driver figure: no memory rule
    assert drop_reason("varlen_attention.fwd", (128, 128, 8, 3), attn_key, unknown) is None
    assert drop_reason("varlen_attention.dq", (128, 32, 4, 5), attn_key, TURING)  # 5 stages on sm75
    assert drop_reason("varlen_attention.dq", (128, 32, 4, 2), attn_key, TURING) is None
    cols_key = (3072, 32, torch.bfloat16, 16384, torch.device("cpu"))
    assert drop_reason("lowrank.cols", (128, 64, 4, 3, 2), cols_key, H100) is None


def test_prune_caps_compiled_variants_and_keeps_their_grid_only_siblings(monkeypatch):
    monkeypatch.delenv(launch_prune.MAX_VARIANTS_ENV, raising=False)
    tiles = [(r, w) for r in (1, 2, 4) for w in (4, 8, 16)]
    candidates = [(*t, pps) for pps in (2, 1, 4) for t in tiles]  # backward_configs' shape: 27 configs
    kept = prune("x.bwd", KEY, candidates, H100)
    variants = {c[:2] for c in kept}
    assert variants == set(tiles[:4])  # the kernel's own order decides without a prior
    assert len(kept) == 4 * 3  # each kept tile at every programs-per-SM count
    monkeypatch.setenv(launch_prune.MAX_VARIANTS_ENV, "0")
    assert sorted(prune("x.bwd", KEY, candidates, H100)) == sorted(candidates)
    monkeypatch.setenv(launch_prune.MAX_VARIANTS_ENV, "1")
    assert {c[:2] for c in prune("x.bwd", KEY, candidates, H100)} == {tiles[0]}


def test_prune_puts_the_prior_first(monkeypatch):
    monkeypatch.delenv(launch_prune.MAX_VARIANTS_ENV, raising=False)
    candidates = [(1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (0, 4)]
    wins = {(0, 4): 5, (2, 8): 1}  # how often each won this kernel in the shipped tables
    assert prune("x.fwd", KEY, candidates, H100, wins=wins) == [(0, 4), (2, 8), (1, 4), (1, 8)]
    # a same-arch card's pick for this key: it and one more variant
    assert prune("x.fwd", KEY, candidates, H100, known=(4, 8), wins=wins) == [(4, 8), (0, 4)]
    # a known pick this card cannot run is no prior
    assert prune("x.bwd", KEY, [(1, 4, 2), (1, 16, 4)], RTX4090, known=(1, 16, 4)) == [(1, 4, 2)]
    # every config dropped: the kernel's default still runs
    assert prune("x.bwd", KEY, [(1, 32, 2)], RTX4090) == [(1, 32, 2)]


def test_launch_prior_reads_the_shipped_tables(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.SHIPPED_ENV, raising=False)
    shipped = tmp_path / "tables"
    shipped.mkdir()

    def table(arch, picks):
        launches = {row: {"config": list(c), "candidates": [], "us": {}} for row, c in picks.items()}
        return json.dumps({"arch": arch, "versions": {"torch": "9"}, "entries": {}, "launches": launches})

    (shipped / "NVIDIA_H200.json").write_text(table("sm90", {ROW: (2, 8, 1), "demo.bwd|1024|x|1": (2, 8, 2)}))
    (shipped / "NVIDIA_A100.json").write_text(table("sm80", {ROW: (1, 4, 2), "other.fwd|1": (1, 4)}))
    monkeypatch.setattr(tuning, "SHIPPED_DIR", shipped)
    tuning._shipped_tables.cache_clear()
    try:
        known, wins = tuning.launch_prior("demo.bwd", ROW, "sm90")
        assert known == (2, 8, 1) and wins == {(2, 8): 2, (1, 4): 1}  # variants: programs per SM left out
        assert tuning.launch_prior("demo.bwd", ROW, "sm89")[0] is None  # no table of that arch
        monkeypatch.setenv(tuning.SHIPPED_ENV, "0")
        assert tuning.launch_prior("demo.bwd", ROW, "sm90") == (None, {})
    finally:
        tuning._shipped_tables.cache_clear()


def test_a_card_never_timed_times_only_the_sibling_pick_and_one_more(picker, monkeypatch, tmp_path):
    """An H100 (no table of its own) beside the H200's shipped table: a key the H200 picked is timed
    among 2 compiled variants, not all of them."""
    monkeypatch.delenv(tuning.SHIPPED_ENV, raising=False)
    monkeypatch.setattr(triton_utils, "_arch", lambda device: "sm90")
    monkeypatch.setattr(launch_prune, "card_limits", lambda device: H100)
    monkeypatch.setattr(tuning, "launch_prior", lambda name, row, arch: ((2, 8, 1), {}))
    candidates = [(r, w, pps) for pps in (2, 1, 4) for r in (1, 2, 4) for w in (4, 8, 16)]
    picker.speed.update({c: 50.0 for c in candidates} | {(2, 8, 1): 5.0, (1, 4, 2): 7.0})
    assert picker(candidates) == (2, 8, 1)
    assert {c[:2] for c in picker.timed} == {(2, 8), (1, 4)}
    stored = json.loads((tmp_path / "tuning" / "cpu.json").read_text())["launches"][ROW]
    assert stored["candidates"][0] == [2, 8, 1] and len(stored["candidates"]) == 6
    assert sorted(map(tuple, stored["offered"])) == sorted(candidates)
    picker.new_process()
    assert picker(candidates) == (2, 8, 1) and picker.timed == []


# ---- compiled kernels


def test_compile_caches_go_under_the_user_cache_unless_the_user_set_them(tmp_path, monkeypatch):
    for name in (*compile_cache_env_names(), "KOHAKUMOSS_SET_COMPILE_CACHES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    got = share_compile_caches(tmp_path / "cache")
    assert got["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # the user's
    assert got["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"
    assert got["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "inductor")
    assert got["TILELANG_CACHE_DIR"] == str(tmp_path / "cache" / "tilelang")
    assert got["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    # a child with another cache folder: ours follow it, the user's stay
    got = share_compile_caches(tmp_path / "other")
    assert got["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "other" / "inductor")
    assert got["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def compile_cache_env_names() -> tuple[str, ...]:
    from kohakumoss_kernels.tuning.compile_caches import CACHE_DIRS, CACHE_SWITCHES

    return (*CACHE_DIRS, *CACHE_SWITCHES)


def test_importing_the_kernels_points_triton_and_inductor_into_the_cache(tmp_path):
    """In a fresh process, as a run starts: Triton's and Inductor's own lookups answer our folders."""
    script = textwrap.dedent(
        """
        import json, kohakumoss_kernels
        from triton import knobs
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        import torch._inductor.config as inductor, torch._functorch.config as functorch
        print(json.dumps([knobs.cache.dir, cache_dir(), inductor.fx_graph_cache, functorch.enable_autograd_cache]))
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in compile_cache_env_names() and k != "KOHAKUMOSS_SET_COMPILE_CACHES"
    }
    env.update(PYTHONPATH=str(ROOT / "src"), KOHAKUMOSS_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    triton_dir, inductor_dir, fx, aot = json.loads(out.stdout.splitlines()[-1])
    assert triton_dir == str(tmp_path / "triton") and inductor_dir == str(tmp_path / "inductor")
    assert fx is True and aot is True


def test_backends_far_slower_on_a_same_arch_card_are_not_timed(tmp_path, monkeypatch):
    """A shape key a shipped table of the same arch timed: backends over 1.5x its winner there are left
    out (the reference, mostly), backends it never timed are in; the row still counts them as tried."""
    monkeypatch.delenv(tuning.SHIPPED_ENV, raising=False)
    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path))
    op = "fake_prior_op"
    calls: list[str] = []

    def backend(tag):
        def run(x):
            calls.append(tag)
            return x * 2

        return run

    register_op(op, backend("eager"), compile=False)
    register_backend(op, "triton", backend("triton"))
    register_backend(op, "addmm", backend("addmm"))
    register_backend(op, "onehot", backend("onehot"))
    x = torch.ones(8)
    key = shape_key(op, x)
    ms = {"triton": 0.10, "addmm": 0.14, "eager": 3.0}  # onehot: added since that table was timed
    shipped = tmp_path / "tables"
    shipped.mkdir()
    (shipped / "NVIDIA_H200.json").write_text(
        json.dumps({"arch": "sm90", "versions": {}, "entries": {key: {"backend": "triton", "ms": ms}}})
    )
    monkeypatch.setattr(tuning, "SHIPPED_DIR", shipped)
    tuning._shipped_tables.cache_clear()
    try:
        names = ["triton", "addmm", "onehot", "eager"]
        assert tuning.backends_worth_timing(key, "sm90", names) == ["triton", "addmm", "onehot"]
        assert tuning.backends_worth_timing(key, "sm80", names) == names  # no table of that arch
        assert tuning.backends_worth_timing("other|key", "sm90", names) == names
        table = tuning.TuningTable(tmp_path / "tuning" / "H100.json")
        bound = resolve(op, "sm90", torch.float32, backend="triton,addmm,onehot", tune="table", table=table)
        with tuning.tuning_window():
            bound(x)
        assert "eager" not in calls and {"triton", "addmm", "onehot"} <= set(calls)
        assert table.get(key, ["triton", "addmm", "onehot", "eager"]) is not None  # nothing left to time
        monkeypatch.setenv(tuning.SHIPPED_ENV, "0")
        assert tuning.backends_worth_timing(key, "sm90", names) == names
    finally:
        tuning._shipped_tables.cache_clear()


def test_shipped_lycoris_tables_seed_the_users_lycoris_folder(tmp_path, monkeypatch):
    """lycoris-lora's launch configs ship beside ours (tables/lycoris/<arch>-<card>.json): a folder that
    lacks the file gets it, one that has it keeps its own; KOHAKUMOSS_SHIPPED_TABLES=0 seeds nothing."""
    shipped = tmp_path / "tables"
    (shipped / "lycoris").mkdir(parents=True)
    (shipped / "lycoris" / "sm90-nvidia-h100.json").write_text('{"version": 2, "entries": []}')
    (shipped / "lycoris" / "sm90-nvidia-h200.json").write_text('{"version": 2, "entries": ["shipped"]}')
    mine = tmp_path / "cache" / "lycoris"
    (mine / "kernels").mkdir(parents=True)
    (mine / "kernels" / "sm90-nvidia-h200.json").write_text("mine")
    monkeypatch.setattr(tuning, "SHIPPED_DIR", shipped)
    monkeypatch.setenv("LYCORIS_KERNEL_CACHE_DIR", str(mine))
    monkeypatch.setenv(tuning.SHIPPED_ENV, "0")
    tuning.share_cache_with_lycoris()
    assert not (mine / "kernels" / "sm90-nvidia-h100.json").exists()
    monkeypatch.delenv(tuning.SHIPPED_ENV)
    assert tuning.share_cache_with_lycoris() == mine
    assert json.loads((mine / "kernels" / "sm90-nvidia-h100.json").read_text()) == {
        "version": 2,
        "entries": [],
    }
    assert (mine / "kernels" / "sm90-nvidia-h200.json").read_text() == "mine"
    assert tuning.seed_lycoris_tables(mine) == []  # nothing left to copy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cards_limits_are_read_and_keep_the_shipped_winners():
    """On a real card: its limits as the rules read them (the opt-in shared memory, not torch's 48 KiB
    default), and no config that won on the H200 is dropped on an sm90 card."""
    card = launch_prune.card_limits("cuda")
    assert card is not None and card.sm >= 75 and card.warps_per_sm in (32, 48, 64)
    assert card.shared_bytes is not None and card.shared_bytes > 64 * 1024
    if card.sm != 90:
        return
    table = json.loads((tuning.SHIPPED_DIR / "NVIDIA_H200.json").read_text())
    dtypes = {str(d): d for d in (torch.bfloat16, torch.float16, torch.float32)}
    for row, entry in table["launches"].items():
        name, *parts = row.split("|")
        key = tuple(dtypes.get(p, int(p) if p.lstrip("-").isdigit() else p) for p in parts)
        assert drop_reason(name, tuple(entry["config"]), key, card) is None, row
