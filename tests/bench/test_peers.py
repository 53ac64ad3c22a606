"""scripts/bench/peers.py: each side's command, what it reads back, the comparison rows, and that the peers
read the weights written for them (their packages from scripts/bench/bundle_peers.sh's wheels)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .scripts import load_bench

REPO = Path(__file__).resolve().parents[2]
PEER_WHEELS = REPO / ".whl" / "peers"
LOCAL_WHEELS = REPO / ".whl" / "local"


@pytest.fixture(scope="module")
def peers():
    return load_bench("peers")


def args(peers, tmp_path, **over):
    """peers.py's options for the 5B rows on the GPU, as its command line would give them."""
    base = dict(peer_root=str(tmp_path / "peers"), work=str(tmp_path / "work"), preset="moss-image-5b",
                device="cuda", size=1024, images=16, caption_words="3-40", steps=20, warmup=5, row_timeout=900,
                text_tokens=256, set=[], sample_steps=50, weights_dir=str(tmp_path / "weights"),
                seed_cache=None)  # fmt: skip
    return argparse.Namespace(**{**base, **over})


def fake_km010_install(tmp_path: Path) -> None:
    """The folder layout of 0.1.0's install (its bundle), so peers.py counts it as installed."""
    (tmp_path / "peers" / "kohakumoss-0.1.0" / "kohakumoss" / "bundle" / "configs" / "moss").mkdir(
        parents=True
    )


def test_dry_run_prints_every_sides_command_and_why_a_peer_does_not_run(peers, tmp_path, capsys):
    fake_km010_install(tmp_path)
    rows = ("lora/whole", "lora/card24", "lora/card8", "sample/whole")
    peers.main(["--dry-run", "--peer-root", str(tmp_path / "peers"), "--work", str(tmp_path / "work"),
                "--weights-dir", str(tmp_path / "weights"), "--card-gb", "80",
                "--rows", ",".join(rows)])  # fmt: skip
    out = capsys.readouterr().out
    blocks = {b.split("\n", 1)[0]: b for b in out.split("=== ")[1:]}
    assert set(blocks) == {f"{p} {r}" for p in ("kohakumoss", *peers.PEERS) for r in rows}
    ours = blocks["kohakumoss lora/card24"]
    assert "scripts/train/moss.py" in ours and "CARD_GB=24.0" in ours and "RANK=32" in ours
    # one micro-step of 2 images per optimizer step on every row (the 8 GB layer's GRAD_ACCUM is 4)
    for row in ("lora/whole", "lora/card24", "lora/card8"):
        assert (
            "GRAD_ACCUM=1 " in blocks[f"kohakumoss {row}"]
            and "GRAD_ACCUM=4" not in blocks[f"kohakumoss {row}"]
        )
    assert "CARD_GB=0.0" in blocks["kohakumoss lora/whole"]  # the layer of --card-gb's 80 GB card
    km = blocks["kohakumoss-0.1.0 lora/card24"].splitlines()[1:]
    assert len(km) == 3  # its two cache scripts, then its trainer
    assert all("capped_run.py 24.0 -m kohakuengine.cli run" in line for line in km)
    assert "cache_latents.py" in km[0] and "IMAGE_ENCODER=peer_encoders.random_latents" in km[0]
    assert "cache_text.py" in km[1] and "TEXT_ENCODER=peer_encoders.random_text" in km[1]
    assert km[2].split()[0].startswith("PYTHONPATH=") and "/src" not in km[2].split()[0]  # none of ours
    assert "bundle/scripts/train/moss.py" in km[2]
    assert (
        "not run: " in blocks["simpletuner-4.10.1 lora/card24"]
        and "not run: " in blocks["diffsynth-2.1.12 sample/whole"]
    )
    assert "scripts/bench/sample.py" in blocks["kohakumoss sample/whole"] and "--steps 50" in out
    sample = blocks["kohakumoss-0.1.0 sample/whole"]
    assert "bundle/scripts/sample/sample.py" in sample and "STEPS=50" in sample and "CFG=3.0" in sample
    assert "SIZES=[(1024, 1024)]" in sample and "weights/moss-image-5b/pipeline" in sample


def test_km010_row_config_is_its_own_layers_then_the_benchmark_knobs(peers, tmp_path):
    fake_km010_install(tmp_path)
    a = args(peers, tmp_path)
    text = peers.km010_config(a, "lora/card8").read_text()
    namespace: dict = {}
    body = text.split("\n\n", 2)[-1]
    assert 'use_config("' in text and "vram/vram_8g.py" in text and "_base/base_lora.py" in text
    exec(body.split("\n\n", 1)[1], namespace)  # the knobs after the layers: plain Python values
    assert (namespace["BATCHING"], namespace["BATCH_SIZE"], namespace["DIM"], namespace["PRESET"]) == (
        "count",
        2,
        32,
        "attn-mlp",
    )
    assert namespace["WEIGHTS"] == str(tmp_path / "weights" / "moss-image-5b" / "transformer")
    assert (
        namespace["LATENT_CACHE"] == namespace["TEXT_CACHE"] == "offline"
        and "ARCH_OVERRIDES" not in namespace
    )
    full = peers.km010_config(a, "full/whole").read_text()
    assert "_base/base_full.py" in full and "DIM = " not in full  # its full fine-tune keeps its own settings
    tiny = peers.km010_knobs(args(peers, tmp_path, preset="tiny"), "lora/whole")
    assert tiny["ARCH_OVERRIDES"]["dim"] == 256 and tiny["ARCH_OVERRIDES"]["depth"] == 4
    # its tuning tables (its own and lycoris-lora's) one per row, its compilers' caches apart from ours
    env = peers.km010_env(a, "lora/card8")
    tables = Path(a.work) / "km010-kernel-cache" / "lora-card8"
    assert env["KOHAKUMOSS_KERNEL_CACHE"] == str(tables) and env["LYCORIS_KERNEL_CACHE_DIR"] == str(
        tables / "lycoris"
    )
    assert env["TRITON_CACHE_DIR"] == str(Path(a.work) / "km010-compiled" / "triton")


# knobs of 0.1.0's layers the rows may set otherwise besides KM010_STEP_CHANGES: the run's weights, data and
# logging, and TEXT_DROP 0 (the same data as ours: no caption dropped)
KM010_RUN_KNOBS = ("WEIGHTS", "DATASETS", "TEXT_DROP", "STEPS", "SAVE_EVERY", "LOG_EVERY", "SAMPLE_EVERY",
                   "EXPORT_FORMATS")  # fmt: skip


def test_km010_rows_keep_its_own_layers_but_the_batching_and_warm_up(peers, tmp_path):
    """Each training row's config, loaded as kogine loads it over 0.1.0's real bundled layers, differs from
    those layers alone only in BATCHING, BATCH_SIZE, the LR warm-up and the run's data and logging knobs:
    its memory profile, token limit, precision and adapter mode are its own 24 GB / 8 GB / auto settings."""
    from kohakuengine.config.loader import load_config_file

    target = peer_install(tmp_path / "peers", "kohakumoss-0.1.0", "kohakumoss-0.1.0-*.whl")
    a = args(peers, tmp_path, peer_root=str(target.parent))
    bundle = peers.km010_bundle(Path(a.peer_root)) / "configs" / "moss"
    own = {"lora/card24": ("balanced", 12288), "lora/card8": ("minimal", 4352), "lora/whole": ("auto", 12288),
           "full/whole": ("auto", 12288)}  # fmt: skip
    for row, layers in peers.KM010_LAYERS.items():
        alone = tmp_path / f"layers-{row.replace('/', '-')}.py"
        alone.write_text("from kohakuengine import use_config\n" + "".join(
            f'use_config("{bundle / layer}")\n' for layer in layers))  # fmt: skip
        theirs = load_config_file(alone).globals_dict
        ours = load_config_file(peers.km010_config(a, row)).globals_dict
        changed = {k for k, v in theirs.items() if k.isupper() and ours.get(k) != v}
        assert changed <= {*peers.KM010_STEP_CHANGES, *KM010_RUN_KNOBS}, (row, changed)
        assert (ours["MEMORY_PROFILE"], ours["MAX_TOKENS"]) == own[row], row
        assert (ours["BATCHING"], ours["BATCH_SIZE"], ours["SCHEDULE"]["warmup"]) == ("count", 2, 0)
    full = load_config_file(peers.km010_config(a, "full/whole")).globals_dict
    assert (full["ALGO"], full["OPTIMIZER"], full["EMA"]) == ("full", "muon", 0.9999)


def test_a_km010_run_folder_reads_back_as_the_columns(peers, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "time": 0.0, "loss": 1.0, "tokens_per_s": 8192 / t, "samples_per_s": 2 / t, "step_time": t,
             "vram_peak_alloc": p} for s, t, p in ((1, 90.0, 7.0), (2, 2.0, 6.0), (3, 1.0, 6.5), (4, 3.0, 6.1))]  # fmt: skip
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "log.txt").write_text(
        "[01:02:03] [ops] [INFO] attention_varlen: triton failed, falling back to compile\n"
        "[01:02:03] [ops] [INFO] attention_varlen: triton failed, falling back to compile\n"
        "[01:02:04] [train] [INFO] step 1\n"
    )
    got = peers.read_km010(run, warmup=1, caption_tokens=20.0)
    assert got["steps"] == 4 and got["first_step_s"] == 90.0 and got["s_per_step"] == 2.0
    assert got["images_per_s"] == 1.0 and got["image_tokens_per_s"] == 4096.0
    assert got["joint_tokens_per_s"] == 4096.0 + 1.0 * 20.0  # image tokens/s + images/s x caption tokens
    assert (
        got["peak_torch_gib"] == 7.0 and len(got["fallbacks"]) == 1 and "falling back" in got["fallbacks"][0]
    )
    ours = peers.from_user_run({"steps": 20, "step_s": 0.5, "tokens_per_s": 17000.0, "peak_gib": 30.0,
                                "first_step_s": 100.0, "wall_s": 59.0}, 20.0, 1024)  # fmt: skip
    assert ours["images_per_s"] == 4.0 and ours["image_tokens_per_s"] == 2 * 4096 / 0.5
    assert ours["joint_tokens_per_s"] == 17000.0 and ours["peak_torch_gib"] == 30.0
    assert ours["wall_s"] == 59.0  # the trainer's launch to exit, as a peer's
    line = peers.table({("kohakumoss", "lora/card24"): {**ours, "completed": True}})[1]
    assert line.split()[-1] == "59"  # the run s column


def test_a_km010_sampler_log_reads_back_as_the_columns(peers, tmp_path):
    (tmp_path / "metadata-0000.json").write_text(json.dumps({"run": {"generate_s": 30.0}}))
    log = "[02:00:01] [inference.steplog] [INFO] steps: first 3.00 s, then 0.500 s/step\n"
    got = peers.read_km010_sample(tmp_path, log, steps=50)
    assert (got["steps"], got["first_step_s"], got["s_per_step"], got["generate_s"]) == (50, 3.0, 0.5, 30.0)
    assert got["images_per_s"] == 1 / (3.0 + 49 * 0.5)  # the sampler steps alone, as ours
    assert peers.read_km010_sample(tmp_path, "no step line", steps=50)["steps"] == 0  # not completed


def test_comparison_rows_pair_both_sides_and_the_doc_json_lists_what_did_not_run(peers, tmp_path):
    done = {"completed": True, "s_per_step": 1.0, "images_per_s": 2.0, "peak_torch_gib": None}
    results = {
        ("kohakumoss", "lora/card24"): {
            **done,
            "s_per_step": 0.5,
            "images_per_s": 4.0,
            "peak_torch_gib": 20.0,
        },
        ("kohakumoss-0.1.0", "lora/card24"): {**done, "peak_torch_gib": 9.0},
        ("kohakumoss", "lora/card8"): {**done},
        ("kohakumoss-0.1.0", "lora/card8"): {"completed": False, "stopped": "exit 1: out of memory"},
        ("simpletuner-4.10.1", "lora/card24"): {"completed": False, "not_measured": "not installable"},
    }
    rows = peers.comparison(results)
    assert {(r["row"], r["metric"]) for r in rows} == {("lora/card24", m) for m in ("s_per_step", "images_per_s",
                                                                                      "peak_torch_gib")}  # fmt: skip
    speed = next(r for r in rows if r["metric"] == "images_per_s")
    assert speed == {"peer": "kohakumoss-0.1.0", "row": "lora/card24", "metric": "images_per_s", "ours": 4.0,
                     "theirs": 2.0, "unit": "images/s", "higher_is_better": True}  # fmt: skip
    assert next(r for r in rows if r["metric"] == "s_per_step")["higher_is_better"] is False
    path = tmp_path / "peers_2026-12-07.json"
    peers.write_doc_json(path, results, args(peers, tmp_path))
    doc = json.loads(path.read_text())
    assert doc["rows"] == rows and doc["config"]["rank"] == 32 and doc["config"]["images_per_step"] == 2
    assert doc["config"]["steps"] == 20  # this call's options: no side carries its own
    assert doc["not_measured"] == [
        {"peer": "simpletuner-4.10.1", "row": "lora/card24", "why": "not installable"}
    ]
    assert doc["failed"] == [
        {"peer": "kohakumoss-0.1.0", "row": "lora/card8", "why": "exit 1: out of memory"}
    ]
    # a later call's --merge reads an earlier call's --out back as the same sides
    out = tmp_path / "peers.json"
    out.write_text(json.dumps([{"peer": p, "row": r, **v} for (p, r), v in results.items()]))
    assert peers.merged([str(out)]) == results


def test_our_side_again_on_a_card_of_a_peers_peak_runs_under_it_and_pairs_as_row_at_peak(
    peers, tmp_path, monkeypatch
):
    theirs = {
        "completed": True,
        "s_per_step": 0.9,
        "images_per_s": 2.2,
        "peak_torch_gib": 8.343,
        "peak_smi_gib": 9.68,
    }
    earlier = tmp_path / "km010.json"
    earlier.write_text(json.dumps([{"peer": "kohakumoss-0.1.0", "row": "lora/card24", **theirs}]))
    assert (
        peers.at_peak_row("lora/card24", 9.68) == "card9.6/lora/2"
    )  # rounded down: no more than theirs held
    assert peers.peer_peak({"peak_torch_gib": 8.3}) == 8.3  # no nvidia-smi reading: the torch peak
    assert peers.at_peak_row("lora/whole", 61.0) == "card61/lora/2"
    ran = []

    def run_ours(a, row, ur, ur_a, our_row=None):
        ran.append((row, our_row))
        return {"completed": True, "s_per_step": 0.7, "images_per_s": 2.9, "peak_torch_gib": 7.9}

    monkeypatch.setattr(peers, "run_ours", run_ours)
    monkeypatch.setattr(peers, "prepare", lambda a, layouts: None)
    doc = tmp_path / "peers.json"
    got = peers.main(["--rows", "lora/card24", "--peers", "", "--skip-ours", "--merge", str(earlier),
                      "--at-peer-peak", "--work", str(tmp_path / "work"), "--doc-json", str(doc),
                      "--out", str(tmp_path / "out.json")])  # fmt: skip
    assert ran == [("lora/card24", "card9.6/lora/2")]
    assert got[("kohakumoss", "lora/card24@peak-of-kohakumoss-0.1.0")]["our_row"] == "card9.6/lora/2"
    rows = {(r["row"], r["metric"]): (r["ours"], r["theirs"]) for r in json.loads(doc.read_text())["rows"]}
    assert rows[("lora/card24@peak", "images_per_s")] == (2.9, 2.2)
    assert rows[("lora/card24@peak", "peak_torch_gib")] == (7.9, 8.343)
    assert ("lora/card24", "images_per_s") not in rows  # our uncapped side did not run in these calls


def peer_install(tmp_path: Path, peer: str, wheel: str, *extra: str) -> Path:
    """`peer`'s wheel (bundle_peers.sh's) installed into a folder of its own, as the GPU call does, with
    `extra` wheels built for this Python (bundle_peers.sh's .whl/local/)."""
    found = [sorted((PEER_WHEELS / peer).glob(wheel))[:1]]
    for name in extra:  # this Python's build first (a compiled wheel), else the GPU bundle's pure one
        found.append((sorted(LOCAL_WHEELS.glob(name)) or sorted((PEER_WHEELS / peer).glob(name)))[:1])
    wheels = [w for ws in found for w in ws]
    if len(wheels) < 1 + len(extra):
        pytest.skip(
            f"no {wheel} {extra} under {PEER_WHEELS}, {LOCAL_WHEELS}: run scripts/bench/bundle_peers.sh"
        )
    target = tmp_path / peer
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    *map(str, wheels)], check=True)  # fmt: skip
    return target


def test_kohakumoss_010_loads_the_hf_weights_written_for_it_as_written(peers, tmp_path):
    """0.1.0's own loader (in its own process, its install folder alone on PYTHONPATH) reads
    write_weights.py's hf folder of the tiny preset: every tensor equals ours."""
    target = peer_install(tmp_path, "kohakumoss-0.1.0", "kohakumoss-0.1.0-*.whl")
    write_weights = peers.load_script("write_weights")
    folder = write_weights.write(tmp_path / "weights", "tiny", ["hf"], seed=0, device="cpu")["hf"]
    out = tmp_path / "theirs.safetensors"
    code = (
        "import torch, sys\nfrom safetensors.torch import save_file\nimport kohakumoss\n"
        "assert kohakumoss.__file__.startswith(sys.argv[3]), kohakumoss.__file__\n"
        "from kohakumoss.model.io.load import load_backbone\n"
        "m, report = load_backbone(sys.argv[1], device='cpu', dtype=torch.float32, keep_fp32=())\n"
        "assert report.ok, report\n"
        "save_file({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[2])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    subprocess.run([sys.executable, "-c", code, str(folder), str(out), str(target)], env=env, check=True)
    theirs = load_file(str(out))
    ours = {}
    for f in folder.glob("*.safetensors"):
        ours.update(load_file(str(f)))
    assert set(theirs) - {"rope.bands"} == set(ours) - {"rope.bands"}
    for key, value in ours.items():
        if key != "rope.bands":
            assert torch.equal(theirs[key], value.float()), key


def test_our_hf_layout_is_the_file_diffsynth_recognises_as_the_moss_image_dit(tmp_path):
    """DiffSynth-Studio picks a model class by the md5 of a file's keys and shapes: the 5B preset's hf
    layout (as save_backbone writes it, rope.bands included) hashes to its registered moss_image_dit."""
    from kohakumoss.model.backbone import MossBackbone
    from kohakumoss.model.layouts import LAYOUTS
    from kohakumoss.model.presets import get_preset

    target = peer_install(tmp_path, "diffsynth-2.1.12", "diffsynth-2.1.12-*.whl")
    # its key hash alone (its package's __init__ imports modelscope, imageio, ...: not needed for this)
    spec = importlib.util.spec_from_file_location("diffsynth_file", target / "diffsynth/core/loader/file.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    registered = (target / "diffsynth/configs/model_configs.py").read_text()
    with torch.device("meta"):
        state = LAYOUTS["hf"].from_native(MossBackbone(get_preset("moss-image-5b")).state_dict())
    digest = loader.hash_state_dict_keys(state)
    assert f'"model_hash": "{digest}",\n        "model_name": "moss_image_dit"' in registered
    del state["rope.bands"]  # a file without the derived constant would not be recognised
    assert loader.hash_state_dict_keys(state) not in registered


def test_diffsynth_ships_no_moss_image_script_of_its_own_to_run(peers):
    """Why DiffSynth-Studio has no side (peers.CANNOT): its README's MOSS-Image training and sampling scripts
    are a clone's examples/, which neither its wheel nor its sdist holds; its wheel has the model code."""
    import tarfile
    import zipfile

    wheels = sorted((PEER_WHEELS / peers.DIFFSYNTH).glob("diffsynth-2.1.12-*.whl"))
    if not wheels:
        pytest.skip(f"no diffsynth wheel under {PEER_WHEELS}: run scripts/bench/bundle_peers.sh")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        readme = wheel.read("diffsynth-2.1.12.dist-info/METADATA").decode()
        runner = wheel.read("diffsynth/diffusion/runner.py").decode()
    assert "diffsynth/pipelines/moss_image.py" in names and "diffsynth/models/moss_image_dit.py" in names
    assert not [n for n in names if not n.startswith(("diffsynth/", "diffsynth-2.1.12.dist-info/"))]
    for script in peers.DIFFSYNTH_SCRIPTS:
        assert script in peers.CANNOT[peers.DIFFSYNTH]
        assert not [n for n in names if n.endswith(script.rsplit("/", 1)[1]) and "moss" in n.lower()]
    # its README points a user at the clone's scripts and installs from source
    assert f"(/{peers.DIFFSYNTH_SCRIPTS[1]})" in readme and f"(/{peers.DIFFSYNTH_SCRIPTS[2]})" in readme
    assert "git clone https://github.com/modelscope/DiffSynth-Studio.git" in readme
    # the generic loop is there (one sample per micro-step); the MOSS-Image module that feeds it is not
    assert "collate_fn=lambda x: x[0]" in runner and "def launch_training_task" in runner
    sdists = sorted(LOCAL_WHEELS.glob("diffsynth-2.1.12.tar.gz"))
    if sdists:
        with tarfile.open(sdists[0]) as sdist:
            members = sdist.getnames()
        assert any(m.endswith("diffsynth/pipelines/moss_image.py") for m in members)
        assert not [m for m in members if "/examples/" in m or m.endswith("/examples")]


def test_kohakumoss_010_samples_from_the_pipeline_tree_written_for_it(peers, tmp_path):
    """write_weights.py's pipeline tree (tiny: transformer/, tokenizer/, text_encoder/, vae/) is what 0.1.0's
    own sampler loads: its sample.py, in its own process, runs the steps and logs their times."""
    target = peer_install(
        tmp_path / "peers", "kohakumoss-0.1.0", "kohakumoss-0.1.0-*.whl", "kohakuvault-0.9.0-*.whl"
    )
    a = args(
        peers, tmp_path, peer_root=str(target.parent), preset="tiny", device="cpu", size=64, sample_steps=2
    )
    peers.load_script("write_weights").write(
        tmp_path / "weights" / "tiny", "tiny", ["pipeline"], device="cpu"
    )
    Path(a.work).mkdir(parents=True)
    got = peers.run_peer(a, peers.km010_sample_side(a))
    assert got["completed"], got
    assert (
        got["steps"] == 2
        and got["s_per_step"] > 0
        and len(list(Path(a.work, "km010-sample").glob("*.png"))) == 1
    )


def test_kohakumoss_010_trains_on_its_own_caches_of_our_data_and_weights(peers, tmp_path):
    """The whole 0.1.0 side on the CPU (tiny preset): its cache scripts fill its vaults through the stand-in
    encoders, then its trainer runs LoRA r32 on 2 images per step from write_weights.py's hf folder."""
    target = peer_install(tmp_path / "peers", "kohakumoss-0.1.0", "kohakumoss-0.1.0-*.whl", "kohakuvault-0.9.0-*.whl",
                          "anyschedule-*.whl")  # fmt: skip
    a = args(peers, tmp_path, peer_root=str(target.parent), preset="tiny", device="cpu", size=128, images=2,
             caption_words="5", steps=2, warmup=0)  # fmt: skip
    peers.prepare(a, ["hf"])
    got = peers.run_peer(a, peers.km010_side(a, "lora/whole"))
    assert got["completed"], got
    assert got["steps"] == 2 and got["s_per_step"] > 0 and got["images_per_s"] > 0
    assert got["joint_tokens_per_s"] > got["image_tokens_per_s"]  # the captions' 5 tokens per image on top
    config = json.loads((Path(a.work) / "km010-runs" / "lora-whole" / "config.json").read_text())
    assert (config["DIM"], config["BATCH_SIZE"], config["TEXT_ENCODER_ID"]) == (32, 2, "random-qwen3.5")


def test_simpletuner_stand_ins_import_but_raise_on_use():
    """SimpleTuner's import-only stand-ins (peer_path/simpletuner_stubs) satisfy the names its modules import
    and raise on any use, so a run that reached their code fails instead of measuring a stand-in."""
    stubs = REPO / "scripts" / "bench" / "peer_path" / "simpletuner_stubs"
    uses = {
        "wandb": "import wandb\nwandb.Table(columns=[])",
        "boto3": "import boto3\nboto3.client('s3')",
        "botocore": "from botocore.exceptions import NoCredentialsError, PartialCredentialsError\n"
        "from botocore.config import Config\nConfig(retries={})",
        "spacy": "from spacy.lang.ar import Arabic\nfrom spacy.lang.en import English\n"
        "from spacy.lang.es import Spanish\nfrom spacy.lang.ja import Japanese\nfrom spacy.lang.zh import Chinese\n"
        "English()",
    }
    assert sorted(p.name for p in stubs.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(uses)
    env = {**os.environ, "PYTHONPATH": str(stubs)}
    for package, code in uses.items():
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=stubs)
        assert run.returncode != 0, package
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("RuntimeError:") and "stand-in was used" in last, (package, run.stderr)


def test_simpletuner_config_is_its_example_with_the_benchmark_changes(peers, tmp_path):
    """SimpleTuner's row config: its own per-card example from its wheel, changed only where the benchmark
    must (2 images of 1 MP, rank 32 on the attention + MLP projections, the pipeline tree, the synthetic
    data, no CREPA or validation), every key one its argument registry knows."""
    import zipfile

    wheel = PEER_WHEELS / "simpletuner-4.10.1" / "simpletuner-4.10.1-py3-none-any.whl"
    if not wheel.exists():
        pytest.skip("no SimpleTuner wheel: bash scripts/bench/bundle_peers.sh --simpletuner")
    root = tmp_path / "peers" / "simpletuner-4.10.1"
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if n.startswith("simpletuner/examples/moss_image-")]
        registry = "\n".join(
            z.read(n).decode() for n in z.namelist()
            if n.startswith("simpletuner/simpletuner_sdk/server/services/field_registry/sections/")
            or n == "simpletuner/helpers/configuration/cmd_args.py"
        )  # fmt: skip
        z.extractall(root, members)
    a = args(peers, tmp_path)
    for row, example in (
        ("lora/card24", "moss_image-24g.peft-lora"),
        ("lora/whole", "moss_image-80g.peft-lora"),
    ):
        path = peers.simpletuner_config(a, row)
        config = json.loads(path.with_suffix(".json").read_text())
        theirs = json.loads((root / "simpletuner" / "examples" / example / "config.json").read_text())
        changed = {k for k in config if config[k] != theirs.get(k)} | (set(theirs) - set(config))
        allowed = {"data_backend_config", "pretrained_model_name_or_path", "output_dir", "train_batch_size",
                   "gradient_accumulation_steps", "lora_rank", "lora_alpha", "peft_lora_target_modules", "resolution",
                   "max_train_steps", "lr_warmup_steps", "checkpoint_step_interval", "validation_step_interval",
                   "validation_disable", "crepa_enabled", "report_to", "user_prompt_library"}  # fmt: skip
        assert changed <= allowed, (row, changed - allowed)
        assert {"data_backend_config", "peft_lora_target_modules", "crepa_enabled"} <= changed, row
        assert config["model_family"] == "moss_image" and config["model_type"] == "lora"
        # its --resolution is an int (pixels; its argument parser refuses 1.048576); the dataset's is area
        assert (config["train_batch_size"], config["lora_rank"], config["resolution"]) == (2, 32, 1024)
        assert config["resolution_type"] == theirs["resolution_type"] == "pixel"
        assert config["crepa_enabled"] is False and config["validation_disable"] is True
        assert config["report_to"] == "simpletuner"  # its own per-step metrics file, read back by peers.py
        for key in allowed - {"user_prompt_library"}:  # what the benchmark sets: keys its registry knows
            assert f'"--{key}"' in registry, f"{key}: not an argument SimpleTuner 4.10.1 knows"
        loader = json.loads(Path(config["data_backend_config"]).read_text())
        assert (
            loader[0]["instance_data_dir"] == str(peers.data_dir(a))
            and loader[0]["caption_strategy"] == "textfile"
        )
        assert (loader[0]["resolution"], loader[0]["resolution_type"]) == (1.048576, "area")
        assert loader[1]["dataset_type"] == "text_embeds"


def fake_simpletuner_install(tmp_path: Path) -> Path:
    """The folders of SimpleTuner's install that peers.py reads: its two per-card MOSS-Image examples."""
    root = tmp_path / "peers" / "simpletuner-4.10.1"
    for example in ("moss_image-24g.peft-lora", "moss_image-80g.peft-lora"):
        folder = root / "simpletuner" / "examples" / example
        folder.mkdir(parents=True)
        config = {"model_family": "moss_image", "model_type": "lora", "report_to": "none", "resolution": 512,
                  "resolution_type": "pixel", "train_batch_size": 1, "dynamo_backend": "inductor"}  # fmt: skip
        (folder / "config.json").write_text(json.dumps(config))
    return root


def test_simpletuner_side_is_its_cli_in_the_row_folder_with_its_own_environment(peers, tmp_path):
    """Each SimpleTuner row runs `simpletuner train` (its console script, st_cli:main) in the folder of the
    row's config.json, with its install folder, the stand-ins and the probe on PYTHONPATH (none of this
    project), `accelerate` on PATH as this Python's, no hub, and the row's cap for the probe; the rows it
    has no setting for say why."""
    root = fake_simpletuner_install(tmp_path)
    a = args(peers, tmp_path)
    peer_path = REPO / "scripts" / "bench" / "peer_path"
    for row, cap, batch in (("lora/whole", "0.0", 2), ("lora/card24", "24.0", 2)):
        assert peers.why_not("simpletuner-4.10.1", row, a) is None
        side = peers.peer_side(a, "simpletuner-4.10.1", row)
        assert side.argv == [sys.executable, "-m", "st_cli", "train"] and side.setup == []
        assert (side.cwd / "config.json").exists() and side.run_dir == side.cwd / "output"
        config = json.loads((side.cwd / "config.json").read_text())
        assert config["output_dir"] == str(side.run_dir) and config["train_batch_size"] == batch
        assert config["dynamo_backend"] == "inductor"  # its example's compile stays
        env = side.env
        assert env["PYTHONPATH"].split(os.pathsep) == [
            str(root),
            str(peer_path / "simpletuner_stubs"),
            str(peer_path / "simpletuner_probe"),
        ]
        assert env["PEER_CAP_GIB"] == cap and env["HF_HUB_OFFLINE"] == "1"
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(Path(a.work) / "simpletuner-compiled" / "inductor")
        launcher = Path(env["PATH"].split(os.pathsep)[0]) / "accelerate"
        assert launcher.read_text().split("\n")[1] == (
            f'exec "{sys.executable}" -m accelerate.commands.accelerate_cli "$@"'
        )
        assert os.access(launcher, os.X_OK)
    for row in ("lora/card8", "full/whole", "sample/whole"):
        assert "SimpleTuner 4.10.1" in peers.why_not("simpletuner-4.10.1", row, a)
    elsewhere = args(peers, tmp_path, peer_root=str(tmp_path / "none"))
    assert "bundle_peers.sh --simpletuner" in peers.why_not("simpletuner-4.10.1", "lora/card24", elsewhere)


def test_a_simpletuner_run_folder_reads_back_as_the_columns(peers, tmp_path):
    """SimpleTuner's training_metrics.jsonl as its LocalMetricsTracker.log writes it
    (helpers/training/local_metrics.py: `_append_json_line(self.metrics_path, {"schema_version":
    SCHEMA_VERSION, "timestamp": _utc_now(), "step": resolved_step, "metrics": metrics})`, the step's record
    holding IterationTracker.iteration_metrics()' "iteration_step_time_seconds", the probe's peak; its
    system-metrics records carry no step time) and its console log as this script's columns."""
    run = tmp_path / "output"
    run.mkdir()
    times = {1: 95.0, 2: 3.0, 3: 1.5, 4: 1.25, 5: 1.0}
    records = []
    for step, seconds in times.items():
        metrics = {"iteration_step_time_seconds": seconds, "seconds_per_step": seconds, "train_loss": 0.5,
                   "probe/peak_allocated_gib": 20.0 + step}  # fmt: skip
        records.append({"metrics": metrics, "schema_version": 1, "step": step,
                        "timestamp": f"2026-12-07T07:14:2{step}.474108+00:00"})  # fmt: skip
        records.append({"metrics": {"system/cpu_percent": 51.4}, "schema_version": 1, "step": step,
                        "timestamp": f"2026-12-07T07:14:2{step}.5+00:00"})  # fmt: skip
    (run / "training_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # its console format (helpers/log_format.py ColorizedFormatter): f"[RANK {rank}] {level_color}{message}{reset}"
    warn = "[RANK 0] \x1b[33m2026-12-07 07:16:3{} [WARNING] Key crop_style not found in the current backend config\x1b[0m"
    log = "\n".join([warn.format("6,687"), warn.format("7,001"), "Epoch 1/3, Steps: 100%"])
    got = peers.read_simpletuner(run, warmup=2, caption_tokens=20.0, size=1024, log=log)
    assert got["steps"] == 5 and got["first_step_s"] == 95.0
    assert got["s_per_step"] == 1.25  # the median of steps 3-5
    assert got["images_per_s"] == 2 / 1.25 and got["image_tokens_per_s"] == 2 * 4096 / 1.25
    assert got["joint_tokens_per_s"] == got["image_tokens_per_s"] + got["images_per_s"] * 20.0
    assert got["peak_torch_gib"] == 25.0
    assert got["fallbacks"] == ["[WARNING] Key crop_style not found in the current backend config"]
    empty = peers.read_simpletuner(tmp_path / "none", warmup=2, caption_tokens=20.0, size=1024, log="")
    assert empty["steps"] == 0 and empty["peak_torch_gib"] is None  # not completed


def test_simpletuner_probe_resets_and_logs_the_step_peak_in_its_training_process(tmp_path):
    """peer_path/simpletuner_probe (SimpleTuner's sitecustomize) wraps its IterationTracker when its module
    loads: the peak counter is reset where its training loop starts and read into each step's metrics."""
    import zipfile

    wheel = PEER_WHEELS / "simpletuner-4.10.1" / "simpletuner-4.10.1-py3-none-any.whl"
    if not wheel.exists():
        pytest.skip("no SimpleTuner wheel: bash scripts/bench/bundle_peers.sh --simpletuner")
    package = tmp_path / "simpletuner" / "helpers" / "training"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    with zipfile.ZipFile(wheel) as z:  # its own tracker module alone (its package __init__s import the rest)
        (package / "iteration_tracker.py").write_bytes(
            z.read("simpletuner/helpers/training/iteration_tracker.py")
        )
    code = (
        "import torch\nresets = []\n"
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.reset_peak_memory_stats = lambda *a: resets.append(1)\n"
        "torch.cuda.max_memory_allocated = lambda *a: 3 * 2**30\n"
        "from simpletuner.helpers.training.iteration_tracker import IterationTracker\n"
        "t = IterationTracker()\nassert not resets\nt.mark_start()\nassert resets == [1]\n"
        "t.record_step(1)\nm = t.iteration_metrics()\n"
        "assert m['probe/peak_allocated_gib'] == 3.0 and 'iteration_step_time_seconds' in m, m\n"
    )
    probe = REPO / "scripts" / "bench" / "peer_path" / "simpletuner_probe"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(probe)]), "PEER_CAP_GIB": "0"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "peers.py probe: cap 0.0 GiB" in run.stderr


def test_sd_scripts_and_ai_toolkit_rows_are_listed_as_not_run_with_why(peers, tmp_path):
    # their MOSS-Image code is on no package index and newer than the readable snapshots, and OpenCV
    # (which ai-toolkit imports) does not fit a call beside .whl/: every row is listed, none is run
    doc = tmp_path / "peers_doc.json"
    work = tmp_path / "work"
    results = peers.main(["--peers", f"{peers.SDSCRIPTS},{peers.AITOOLKIT}", "--skip-ours", "--images", "1",
                          "--size", "64", "--peer-root", str(tmp_path / "peers"), "--work", str(work),
                          "--weights-dir", str(tmp_path / "weights"), "--out", str(tmp_path / "out.json"),
                          "--logs", str(tmp_path / "logs"), "--doc-json", str(doc)])  # fmt: skip
    listed = {(r["peer"], r["row"]): r["why"] for r in json.loads(doc.read_text())["not_measured"]}
    assert set(listed) == {(p, r) for p in (peers.SDSCRIPTS, peers.AITOOLKIT) for r in peers.ROWS}
    assert {listed[(p, "lora/card24")] for p in (peers.SDSCRIPTS, peers.AITOOLKIT)} == {
        peers.CANNOT[peers.SDSCRIPTS],
        peers.CANNOT[peers.AITOOLKIT],
    }
    assert all(peers.OPENCV_WHEEL in listed[(peers.AITOOLKIT, row)] for row in peers.ROWS)
    assert not any(v.get("completed") for v in results.values())
    assert not list(work.glob("*.log")) and not (tmp_path / "weights").exists()  # nothing of theirs ran
