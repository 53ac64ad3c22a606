"""SimpleTuner 4.10.1's side checked where it will run, in seconds, before a row spends minutes on it.

    python3 scripts/bench/peers.py --preflight     # runs this with the side's PYTHONPATH, PATH and cap

Run with SimpleTuner's environment (peers.py `simpletuner_env`): prints Python, glibc, the versions and
folders of the packages its MOSS-Image LoRA path needs, imports its trainer and model family (the probe
then caps the process at PEER_CAP_GIB), checks `accelerate` (the command `simpletuner train` starts) and
the pipeline tree given as the argument, and on a GPU that the cap holds. Every failed check prints a
line starting with FAIL; the exit status is 1 if any did.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import shutil
import sys
import time
from pathlib import Path

# what SimpleTuner 4.10.1's wheel requires of what the image or the carried wheels give (its METADATA)
MINIMUM = {"transformers": "5.6.0", "diffusers": "0.40.0", "accelerate": "1.5.2", "peft": "0.18.0",
           "safetensors": "0.5.3", "numpy": "2.2.0", "pillow": "11.3.0"}  # fmt: skip
PACKAGES = ("torch", "transformers", "diffusers", "accelerate", "peft", "safetensors", "tokenizers",
            "huggingface_hub", "numpy", "pillow", "pandas", "scipy", "torchaudio", "lazy_loader", "psutil",
            "imageio", "trainingsample", "soxr", "librosa", "skrample", "fastapi", "simpletuner")  # fmt: skip
GLIBC = (2, 35)  # trainingsample 0.3.2's wheel is manylinux_2_35 only
TREE = (
    "transformer/config.json",
    "tokenizer/tokenizer_config.json",
    "text_encoder/config.json",
    "vae/config.json",
)


def numbers(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def main() -> int:
    failed: list[str] = []

    def check(ok: bool, line: str) -> None:
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            failed.append(line)

    check(
        sys.version_info >= (3, 12),
        f"python {sys.version.split()[0]} ({sys.executable}); SimpleTuner needs >= 3.12",
    )
    libc = os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    check(numbers(libc.split()[-1]) >= GLIBC, f"{libc}; trainingsample's wheel needs glibc >= 2.35")
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            check(False, f"{name}: not installed")
            continue
        where = metadata.distribution(name).locate_file("")
        low = MINIMUM.get(name)
        check(
            low is None or numbers(version) >= numbers(low),
            f"{name} {version} ({where})" + (f", needs >= {low}" if low else ""),
        )
    check(shutil.which("accelerate") is not None, f"accelerate command: {shutil.which('accelerate')}")
    t0 = time.perf_counter()
    for module in ("simpletuner.train", "simpletuner.helpers.models.moss_image.model"):
        try:
            importlib.import_module(module)
            check(True, f"import {module} ({time.perf_counter() - t0:.0f} s)")
        except Exception as e:  # any import error is the finding to report
            check(False, f"import {module}: {type(e).__name__}: {e}")
    probe = sys.modules.get("sitecustomize")
    check(
        "simpletuner_probe" in str(getattr(probe, "__file__", "")),
        f"probe: {getattr(probe, '__file__', None)} (the sitecustomize it shadows, run: {getattr(probe, 'SHADOWED', None)})",
    )
    if len(sys.argv) > 1:
        tree = Path(sys.argv[1])
        missing = [f for f in TREE if not (tree / f).exists()]
        check(not missing, f"pipeline tree {tree}" + (f": missing {missing}" if missing else ""))
    import torch

    cap = float(os.environ.get("PEER_CAP_GIB") or 0)
    if torch.cuda.is_available() and cap > 0:
        try:
            over = torch.empty(int((cap + 1) * 2**30), dtype=torch.uint8, device="cuda")
            del over
            held = False
        except torch.OutOfMemoryError:
            held = True
        torch.cuda.empty_cache()
        check(held, f"cap {cap} GiB on {torch.cuda.get_device_name(0)}: {cap + 1} GiB refused")
    print("preflight: " + ("FAILED: " + "; ".join(failed) if failed else "every check passed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
