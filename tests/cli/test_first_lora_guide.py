"""docs/guides/first-lora.md, run as a user runs it: every command of its bash blocks, in order, as a
subprocess in a fresh "clone", on a tiny Comfy-Org models folder (ConvRot int8 DiT and text encoder,
single-file VAE, the tokenizer where the README's `hf download` puts it) and on a tiny HF snapshot,
with a kohya set of real photos.

The commands are read from the guide, so the test follows them when they change. What a CPU test must
change is the short list below (SKIPPED, SUBSTITUTIONS, the knobs a user appends to the configs);
anything else in the guide runs as written, and a step that fails fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.tiny_trees import (
    DIT_FILE,
    TEXT_FILE,
    VAE_FILE,
    write_comfy_models,
    write_hf_snapshot,
    write_photo_set,
)

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "first-lora.md"
CAPTIONS = ["a harbour at night, mystyle", "a golden grid on glass, mystyle", "orange tiles in rows, mystyle"]
PROMPTS = ["a lighthouse at dusk, mystyle", "a cat on a windowsill, mystyle"]  # the guide's sample prompts

# Guide commands that do not run here, and why.
SKIPPED = {
    "git clone": "the clone is this checkout (scripts/ and configs/moss/ linked into the test's folder)",
    "bash scripts/install/install.sh": "the test runs in the installed environment",
    "source .venv/bin/activate": "PATH starts with the environment's bin/",
    "hf download": "nothing touches a hub in tests: the tiny tree is written where these commands put it",
    "bash scripts/examples/": "the example scripts run in tests/examples/test_real_run.py",
    "kohakumoss-standins": "the rehearsal trees: tests/trainer/test_standins.py trains and exports on both",
}
# What a CPU run with tiny weights appends to the config files the config tool writes (the guide: "any
# knob ... can be added there"; plan knobs go into my-lora.py before the caches are filled).
TRAIN_KNOBS = {
    "AREA": 64 * 64,
    "MIN_SIDE": 32,
    "STEPS": 2,
    "GRAD_ACCUM": 1,  # the 6 GB layer's 4 micro-steps per step: 4x the CPU time
    "PRECISION": "fp32",  # bf16 matmuls are slow on a CPU
    "WORKERS": 0,
    "OPS_BACKEND": "eager",
    "SAMPLE_WIDTH": 64,
    "SAMPLE_HEIGHT": 64,
    "SAMPLE_STEPS": 2,
}
# the released default skips block 22 in the unconditional branch: the tiny DiT has 4 blocks
SAMPLE_KNOBS = {"WIDTH": 64, "HEIGHT": 64, "STEPS": 2, "PRECISION": "fp32", "UNCOND_SKIP_LAYERS": []}


def bash_commands(markdown: str) -> list[str]:
    """The commands of a markdown text's ```bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def skip_reason(command: str) -> str | None:
    return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)


def substitute(command: str, tree: str, checkpoint: str) -> str:
    """The guide's command for this run: the run's last checkpoint (the guide's runs save at 1000 and 2000
    steps); for the HF snapshot, its folder for the ComfyUI one, as the guide says ("then use --weights
    models/MOSS-Image-Base below")."""
    command = re.sub(r"checkpoints/step_\d{8}", f"checkpoints/{checkpoint}", command)
    if tree == "hf":
        command = command.replace("ComfyUI/models/diffusion_models/" + DIT_FILE, "models/MOSS-Image-Base")
        command = command.replace("--weights ComfyUI/models", "--weights models/MOSS-Image-Base")
    return command


def readme_commands() -> list[str]:
    """The commands of README.md's "Train, sample, export" section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Train, sample, export") :]
    return bash_commands(section[: section.index("\n## ", 1)])


# README's placeholders (`path/to/...`, `...`), per tree: the DiT, the text encoder and the VAE as the
# tree holds them (the Comfy-Org files; the HF snapshot's folders)
README_PATHS = {
    "comfy": {
        "WEIGHTS": "ComfyUI/models/diffusion_models/" + DIT_FILE,
        "TEXT_ENCODER": "ComfyUI/models/text_encoders/" + TEXT_FILE,
        "VAE": "ComfyUI/models/vae/" + VAE_FILE,
    },
    "hf": {
        "WEIGHTS": "models/MOSS-Image-Base/transformer",
        "TEXT_ENCODER": "models/MOSS-Image-Base/text_encoder",
        "VAE": "models/MOSS-Image-Base/vae",
    },
}


def readme_paths(command: str, tree: str, checkpoint: str) -> str:
    for knob, path in README_PATHS[tree].items():
        command = re.sub(rf"{knob}=(\.\.\.|path/to/\S+)", f"{knob}={path}", command)
    return re.sub(r"checkpoints/step_\d{8}", f"checkpoints/{checkpoint}", command)


def test_the_readme_parses_into_the_commands_this_test_runs():
    assert [c.split()[:3] for c in readme_commands() if skip_reason(c) is None] == [
        ["kogine", "run", "scripts/train/moss.py"],
        ["kogine", "run", "scripts/sample/sample.py"],
        ["kogine", "run", "scripts/export/export.py"],
    ]
    assert all("..." not in readme_paths(c, "comfy", "step_00000002") for c in readme_commands()[-2:])


def test_the_guide_parses_into_the_steps_this_test_runs():
    commands = bash_commands(GUIDE.read_text())
    run = [c for c in commands if skip_reason(c) is None]
    assert [c.split()[:3] for c in run] == [
        ["kohakumoss-doctor"],
        ["kohakumoss-config", "new", "train"],
        ["kohakumoss-config", "check", "configs/user/my-lora.py"],
        ["kogine", "run", "scripts/data/inspect_data.py"],
        ["kogine", "run", "scripts/data/cache_text.py"],
        ["kogine", "run", "scripts/data/cache_latents.py"],
        ["kogine", "run", "scripts/train/moss.py"],
        ["kogine", "run", "scripts/export/export.py"],
        ["kogine", "run", "scripts/export/export.py"],
        ["kohakumoss-config", "new", "sample"],
        ["kogine", "run", "scripts/sample/sample.py"],
    ], "the guide's commands changed: check that this test still runs what a user runs"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = write_photo_set(tmp_path_factory.mktemp("photos") / "10_mystyle", CAPTIONS)
    if folder is None:
        pytest.skip("real photos missing: apt-get install -y gnome-backgrounds")
    return folder


def clone(tmp_path: Path, tree: str, photos: Path) -> Path:
    """A fresh checkout's folder as the guide leaves it after steps 1, 3 and 4."""
    root = tmp_path / "KohakuMossTrainer"
    (root / "configs").mkdir(parents=True)
    (root / "scripts").symlink_to(REPO / "scripts")
    (root / "configs" / "moss").symlink_to(REPO / "configs" / "moss")
    words = [*CAPTIONS, *PROMPTS]
    if tree == "comfy":
        write_comfy_models(root / "ComfyUI" / "models", words)
    else:
        write_hf_snapshot(root / "models" / "MOSS-Image-Base", words)
    (root / "data" / "my_set").mkdir(parents=True)
    (root / "data" / "my_set" / "10_mystyle").symlink_to(photos)
    return root


def user_env() -> dict[str, str]:
    """The user's shell after `source .venv/bin/activate`, running this checkout's sources."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO / "src"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "KOHAKUMOSS_SHIPPED_TABLES": "0",
    }


def run(command: str, cwd: Path) -> str:
    r = subprocess.run(
        shlex.split(command), cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=900
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"`{command}` exited {r.returncode}:\n{out[-6000:]}"
    return out


def append_knobs(config: Path, knobs: dict) -> None:
    with config.open("a") as f:
        f.write("\n# a CPU run with tiny weights\n")
        f.writelines(f"{k} = {v!r}\n" for k, v in knobs.items())


def keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*") if (p / "meta.json").exists())


@pytest.mark.parametrize("tree", ["comfy", "hf"])
def test_first_lora_guide_end_to_end(tree, photos, tmp_path):
    root = clone(tmp_path, tree, photos)
    run_dir = root / "runs" / "moss" / "my-lora"
    commands = [c for c in bash_commands(GUIDE.read_text()) if skip_reason(c) is None]
    for command in commands:
        command = substitute(command, tree, (checkpoints(run_dir) or ["step_00000000"])[-1])
        if command.startswith("kogine run scripts/train/moss.py"):
            # 7: a planned stop after one step, then `--set RESUME=latest` continues to STEPS
            run(command + " --set STOP_AT=1", root)
            assert checkpoints(run_dir) == ["step_00000001"]
            out = run(command + " --set RESUME=latest", root)
            assert "resum" in out.lower() + (run_dir / "log.txt").read_text().lower()
            assert checkpoints(run_dir) == ["step_00000001", "step_00000002"]
            for name in ("log.txt", "metrics.jsonl", "config.json"):
                assert (run_dir / name).is_file(), name
            assert list((run_dir / "samples").glob("grid_step_*.png")), "no sample grid"
            assert (run_dir / "export" / "my-lora-comfy.safetensors").is_file()
            continue
        out = run(command, root)
        if command.startswith("kohakumoss-config new train"):
            assert "wrote configs/user/my-lora.py" in out
            append_knobs(root / "configs" / "user" / "my-lora.py", TRAIN_KNOBS)
        elif command.startswith("kohakumoss-config new sample"):
            append_knobs(root / "configs" / "user" / "my-sample.py", SAMPLE_KNOBS)
        elif "inspect_data.py" in command:
            assert (root / "runs" / "inspect" / "my-lora" / "contact_sheet.png").is_file()
        elif "cache_text.py" in command or "cache_latents.py" in command:
            kind = "text" if "cache_text" in command else "latents"
            assert list((root / "cache" / "my-lora" / kind).rglob("*.safetensors")), f"no {kind} cache"
        elif "OUT=exports" in command:
            # NAME defaults to RUN_NAME-stepXXXXX; SAVE_FORMAT 'both' here, SAVE_MERGED=True
            step = checkpoints(run_dir)[-1].removeprefix("step_")[-5:]
            assert {p.name for p in (root / "exports").iterdir()} == {
                f"my-lora-step{step}-comfy.safetensors",
                "lycoris",  # the LyCORIS file in a folder of its own: ComfyUI loads none of its keys
                "merged",
            }
            assert (root / "exports" / "lycoris" / f"my-lora-step{step}.safetensors").is_file()
        elif "OUT=ComfyUI/models/loras/my-lora.safetensors" in command:
            comfy = root / "ComfyUI" / "models" / "loras" / "my-lora.safetensors"
            assert keys(comfy) == keys(run_dir / "export" / "my-lora-comfy.safetensors")
        elif "scripts/sample/sample.py" in command:
            assert list((root / "samples" / "my-sample").glob("*.png")), "the sampler wrote no image"
    # the ComfyUI file the run exported, in the sampler (README: `new sample --adapter`)
    comfy_file = "runs/moss/my-lora/export/my-lora-comfy.safetensors"
    weights = "ComfyUI/models" if tree == "comfy" else "models/MOSS-Image-Base"
    run(f"kohakumoss-config new sample --weights {weights} --name comfy-lora --adapter {comfy_file}", root)
    append_knobs(root / "configs" / "user" / "comfy-lora.py", SAMPLE_KNOBS)
    run(
        f"kogine run scripts/sample/sample.py --config configs/user/comfy-lora.py --set 'PROMPT={PROMPTS[1]}'",
        root,
    )
    assert list((root / "samples" / "comfy-lora").glob("*.png")), "the sampler wrote no image"
    # README's "Train, sample, export": its sample and export commands, the files' paths for its `...`
    for command in readme_commands():
        if skip_reason(command) is not None or "scripts/train/moss.py" in command:
            continue  # the guide's step 7 trained this run; README's train command is the same script
        out_dir = root / "samples" / "readme"
        command = readme_paths(command, tree, checkpoints(run_dir)[-1])
        if "scripts/sample/sample.py" in command:
            knobs = {**SAMPLE_KNOBS, "OUT_DIR": str(out_dir)}
            run(command + "".join(f" --set {shlex.quote(f'{k}={v}')}" for k, v in knobs.items()), root)
            assert list(out_dir.glob("*.png")), "the sampler wrote no image"
        else:
            run(command, root)
            # OUT naming the ComfyUI file: it there, the others beside it (SAVE_FORMAT 'both' here)
            assert keys(root / "my-lora.safetensors") == keys(
                run_dir / "export" / "my-lora-comfy.safetensors"
            )
            assert (root / "my-lora-lycoris" / "my-lora.safetensors").is_file()
