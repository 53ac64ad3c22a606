"""docs/guides/edit-lora.md, run as a user runs it: every command of its bash blocks, in order, as a
subprocess in a fresh "clone" on a tiny HF snapshot whose text encoder holds a vision tower (the
guide's default REFERENCES_IN_PROMPT='picture' shows the references to it), with a tiny kohya edit
dataset (targets and a references folder matched by stem, one target with a second reference).

The commands and the knobs the guide tells the user to add (its ```python block) are read from the
guide, so the test follows them when they change; what a CPU test adds is the short list below (SKIPPED,
the tiny-run knobs appended after the guide's). A command the test does not recognise fails it.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import numpy as np
from PIL import Image
from safetensors import safe_open

from tests.cli.test_first_lora_guide import SAMPLE_KNOBS, append_knobs, bash_commands, checkpoints, run
from tests.cli.test_first_lora_guide import TRAIN_KNOBS as TINY_RUN  # the same tiny CPU run's knobs
from tests.tiny_trees import write_hf_snapshot

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "edit-lora.md"
# the edit dataset: stem -> instruction (the caption); "cat" has two references
CAPTIONS = {
    "cat": "make it night. Keep the cat unchanged.",
    "house": "turn the sky red. Keep the house unchanged.",
}
SAMPLE_PROMPT = "make it night. Keep the dog unchanged."  # the guide's step 6

# Guide commands that do not run here, and why.
SKIPPED = {
    "hf download": "nothing touches a hub in tests: the tiny snapshot is written where it puts the files",
}
EXPECTED = [
    ["kohakumoss-config", "new", "train"],
    ["kohakumoss-config", "check", "configs/user/my-edit.py"],
    ["kogine", "run", "scripts/data/inspect_data.py"],
    ["kogine", "run", "scripts/data/cache_text.py"],
    ["kogine", "run", "scripts/data/cache_latents.py"],
    ["kogine", "run", "scripts/train/moss.py"],
    ["kohakumoss-config", "new", "sample"],
    ["kogine", "run", "scripts/sample/sample.py"],
    ["kogine", "run", "scripts/export/export.py"],
]


def guide_commands() -> list[str]:
    return [c for c in bash_commands(GUIDE.read_text()) if not any(c.startswith(s) for s in SKIPPED)]


def guide_knobs() -> str:
    """The guide's one ```python block: the edit knobs the user adds to configs/user/my-edit.py."""
    (block,) = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return block


def test_the_guide_parses_into_the_steps_this_test_runs():
    steps = [c.split()[:3] for c in guide_commands()]
    assert steps == EXPECTED, (
        "the guide's commands changed: check that this test still runs what a user runs; "
        f"not run here: {[c for c in guide_commands() if c.split()[:3] not in EXPECTED]}, "
        f"gone from the guide: {[e for e in EXPECTED if e not in steps]}"
    )
    knobs: dict = {}
    exec(guide_knobs(), knobs)  # plain assignments, as the config file holds them
    assert knobs["REFERENCES_IN_PROMPT"] == "picture"  # the test's snapshot has a vision tower for it
    new_train = next(c for c in guide_commands() if c.startswith("kohakumoss-config new train"))
    assert "--references data/my_edit_refs" in new_train  # the folder clone() writes


def noise_image(path: Path, seed: int, size: tuple[int, int] = (96, 64)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def clone(tmp_path: Path) -> Path:
    """A checkout as the guide leaves it after its steps 1 and 2: the snapshot, the dataset, a photo."""
    root = tmp_path / "KohakuMossTrainer"
    (root / "configs").mkdir(parents=True)
    (root / "scripts").symlink_to(REPO / "scripts")
    (root / "configs" / "moss").symlink_to(REPO / "configs" / "moss")
    write_hf_snapshot(root / "models" / "MOSS-Image-Base", [*CAPTIONS.values(), SAMPLE_PROMPT], vision=True)
    data, refs = root / "data" / "my_edit" / "10_night", root / "data" / "my_edit_refs" / "10_night"
    for i, (stem, caption) in enumerate(CAPTIONS.items()):
        noise_image(data / f"{stem}.png", i)
        (data / f"{stem}.txt").write_text(caption)
        noise_image(refs / f"{stem}.png", 10 + i, (64, 96))
    noise_image(refs / "cat_1.png", 20, (48, 48))
    noise_image(data / "tree.png", 40)  # no reference: dropped, as step 2 says
    (data / "tree.txt").write_text(CAPTIONS["cat"])
    noise_image(root / "photos" / "dog.jpg", 30)
    return root


def keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def with_inline_references(command: str, out_dir: str) -> str:
    """The guide's sample command with its REFERENCE_IMAGES given as `--ri` inside PROMPT instead (step 6:
    a prompt takes its own references), into `out_dir`."""
    words, kept, sets = shlex.split(command), [], {}
    while words:
        word = words.pop(0)
        if word == "--set" and words[0].startswith(("REFERENCE_IMAGES=", "PROMPT=")):
            key, value = words.pop(0).split("=", 1)
            sets[key] = value
        else:
            kept.append(word)
    refs = ast.literal_eval(sets["REFERENCE_IMAGES"])  # the guide's Python list
    prompt = sets["PROMPT"] + "".join(f" --ri {r}" for r in refs)
    return shlex.join([*kept, "--set", f"PROMPT={prompt}", "--set", f"OUT_DIR={out_dir}"])


def trained_references(png: Path) -> tuple[list[str], str]:
    facts = json.loads(Image.open(png).text["kohakumoss"])
    return facts["references"], facts["references_in_prompt"]


def test_edit_lora_guide_end_to_end(tmp_path):
    root = clone(tmp_path)
    run_dir = root / "runs" / "moss" / "my-edit"
    ran = []
    for command in guide_commands():
        command = re.sub(
            r"checkpoints/step_\d{8}", f"checkpoints/{(checkpoints(run_dir) or ['none'])[-1]}", command
        )
        stop = " --set STOP_AT=1" if "scripts/train/moss.py" in command else ""  # resumed below
        out = run(command + stop, root)
        ran.append(command.split()[:3])
        if command.startswith("kohakumoss-config new train"):
            assert "wrote configs/user/my-edit.py" in out
            refs_folder = root.resolve() / "data" / "my_edit_refs"
            assert f"'references': '{refs_folder}'" in (root / "configs" / "user" / "my-edit.py").read_text()
            config = root / "configs" / "user" / "my-edit.py"
            with config.open("a") as f:
                f.write("\n# the guide's edit knobs\n" + guide_knobs())
            append_knobs(config, TINY_RUN)
        elif command.startswith("kohakumoss-config new sample"):
            append_knobs(root / "configs" / "user" / "my-edit-sample.py", SAMPLE_KNOBS)
        elif "inspect_data.py" in command:
            assert "missing_reference" in out, "the target without a reference was not named"
        elif "cache_latents.py" in command:
            # two targets and their three references, each an entry of the one latent cache
            shards = list((root / "cache" / "my-edit" / "latents").rglob("*.safetensors"))
            assert sum(len(keys(p)) for p in shards) == 5
        elif "cache_text.py" in command:
            assert list((root / "cache" / "my-edit" / "text").rglob("*.safetensors")), "no text cache"
        elif "scripts/train/moss.py" in command:
            # a planned stop after one step, then `--set RESUME=latest` goes on (step 5: as first-lora.md)
            log = (run_dir / "log.txt").read_text()
            assert "vision tower loaded" in log, "the references did not go into the prompt"
            assert checkpoints(run_dir) == ["step_00000001"]
            out = run(command + " --set RESUME=latest", root)
            assert "resum" in out.lower() + (run_dir / "log.txt").read_text().lower()
            assert checkpoints(run_dir) == ["step_00000001", "step_00000002"]
            assert list((run_dir / "samples").glob("grid_step_*.png")), "no sample grid"
            # the config tool's first sample prompt: the first target with its own reference (--ri),
            # shown to the text encoder as in training
            for png in ("base/base_00.png", "step_00000002/sample_00.png"):
                refs, shown = trained_references(run_dir / "samples" / png)
                assert refs == [str(refs_folder / "10_night" / name) for name in ("cat.png", "cat_1.png")]
                assert shown == "picture", png
            assert (run_dir / "export" / "my-edit-comfy.safetensors").is_file()
        elif "scripts/sample/sample.py" in command:
            images = sorted((root / "samples" / "my-edit-sample").glob("0000_*.png"))
            assert images, "the sampler wrote no image"
            facts = json.loads(Image.open(images[0]).text["kohakumoss"])
            assert facts["references"] == ["photos/dog.jpg"]
            assert facts["references_in_prompt"] == "picture"
            # the same references given by `--ri` in the prompt: the same picture and facts
            run(with_inline_references(command, "samples/my-edit-ri"), root)
            inline = root / "samples" / "my-edit-ri" / images[0].name
            assert json.loads(Image.open(inline).text["kohakumoss"])["references"] == ["photos/dog.jpg"]
            assert np.array_equal(np.asarray(Image.open(inline)), np.asarray(Image.open(images[0])))
        elif "scripts/export/export.py" in command:
            comfy = root / "ComfyUI" / "models" / "loras" / "my-edit.safetensors"
            assert keys(comfy) == keys(run_dir / "export" / "my-edit-comfy.safetensors")
    assert ran == EXPECTED, f"the guide's commands that did not run: {[c for c in EXPECTED if c not in ran]}"


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_guides_section_links_reach_a_heading():
    """The guide sends the reader to sections of other pages (tests/test_doc_links.py checks the files)."""
    links = re.findall(r"\]\(([^)#]+\.md)#([^)]+)\)", GUIDE.read_text())
    assert links
    for page, anchor in links:
        assert anchor in heading_anchors((GUIDE.parent / page).read_text()), f"{page}#{anchor}"
