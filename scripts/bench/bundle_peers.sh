#!/usr/bin/env bash
# The peer trainers' wheels for the GPU machine (Python 3.12, x86-64), into .whl/peers/<peer>/ (ignored by
# git, carried with the call beside .whl/). scripts/bench/peers.py runs a peer from its own install folder:
#   for p in .whl/peers/*/; do python3 -m pip install -q --no-index --no-deps --target /tmp/peers/$(basename $p) $p*.whl .whl/*.whl; done
# (the project's .whl/ wheels from ../shared/device/bundle-wheels.sh give a peer kohaku-engine, lycoris-lora
# and diffusers; the image has torch, transformers, accelerate, safetensors, numpy, pillow, tqdm).
# Usage (from the project's root):  bash scripts/bench/bundle_peers.sh [--simpletuner] [--simpletuner-size]
#   [--sdscripts-aitoolkit-size]
#   --simpletuner: also SimpleTuner 4.10.1 and the packages its MOSS-Image LoRA path imports that neither the
#   image nor .whl/ has (docs/performance/peers.md, "SimpleTuner 4.10.1"), into .whl/peers/simpletuner-4.10.1/;
#   wandb, boto3/botocore and spacy, imported but never called there, are scripts/bench/peer_path/simpletuner_stubs/.
#   --simpletuner-size: also download its declared requirements' largest wheels the image lacks into a
#   scratch folder (never carried) and print their size: why they are not carried whole.
#   --sdscripts-aitoolkit-size: the wheels that sd-scripts' and ai-toolkit's trainers import at module level
#   and that neither the image nor .whl/ has (read from their repositories' newest readable commits, which
#   predate MOSS-Image: docs/performance/peers.md), into a scratch folder (never carried), with their sizes.
#   Neither project is on a package index: their code would travel as a git-ignored folder under
#   .whl/peers/, and there is no MOSS-Image version of either to put there (peers.py CANNOT).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"

download() {  # download DIR PKG...: binary wheels for the GPU machine's Python, no dependency resolution
  local dir=$1
  shift
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}

# KohakuMoss 0.1.0 (its import name is this project's: installed into a folder of its own); kohakuvault 0.9.0,
# because 1.x lacks a function 0.1.0 calls and its requirement has no bound; anyschedule, its LR schedules.
# Its torch>=2.13 pin is not installed: --no-deps, and it runs on the image's torch (2.11).
download .whl/peers/kohakumoss-0.1.0 kohakumoss==0.1.0 kohakuvault==0.9.0 anyschedule==0.1.0

# DiffSynth-Studio 2.1.12: for tests/bench/test_peers.py only (its DiT key check; that neither its wheel nor its
# sdist holds its MOSS-Image scripts, which its README runs from a clone's examples/: docs/performance/peers.md,
# peers.py CANNOT); ~1 MB each. The sdist goes to .whl/local/ (tests here), the wheel beside the other peers.
download .whl/peers/diffsynth-2.1.12 diffsynth==2.1.12
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl/local diffsynth==2.1.12

# tests/bench/test_peers.py runs 0.1.0 on this machine's Python too: kohakuvault is a compiled wheel
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl/local kohakuvault==0.9.0

if [[ " $* " == *" --simpletuner "* ]]; then
  # hard module-level imports on its train.py -> Trainer -> moss_image path: trainingsample (image loading,
  # a Rust wheel built for manylinux_2_35 only), fastapi + starlette (trainer.py imports
  # simpletuner_sdk.server services, whose package __init__ imports its app), skrample (scheduled sampling
  # module), atomicwrites (local data backend); fastapi 0.115 because newer ones import opentelemetry; and
  # what the other model families' modules import, which its field registry imports while trainer.py loads
  # (librosa, py3langid, pypinyin, hangul-romanize, num2words, loguru, ftfy + wcwidth, beautifulsoup4 +
  # soupsieve); spaCy, the one large one, is a stand-in in peer_path/simpletuner_stubs/. soxr: with librosa
  # installed, transformers 5.17's audio_utils (imported by every model file through processing_utils) imports
  # soxr, which the image lacks. peft 0.21.2: SimpleTuner needs peft >= 0.18, the image's version is unchecked
  # (this folder comes first on its PYTHONPATH, so this one is used).
  st=.whl/peers/simpletuner-4.10.1
  download "$st" simpletuner==4.10.1 fastapi==0.115.14 starlette==0.46.2 skrample==0.5.3 atomicwrites==1.4.0 \
    librosa==1.0.1 py3langid==0.4.0 pypinyin==0.55.0 hangul-romanize==0.1.0 num2words==0.5.14 loguru==0.7.3 \
    ftfy==6.3.1 wcwidth==0.9.5 beautifulsoup4==4.15.0 soupsieve==4.1.4 soxr==1.1.0 peft==0.21.2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 -d "$st" trainingsample==0.3.2
  echo "SimpleTuner 4.10.1's carried set:"
  du -cb "$st"/*.whl | tail -n 1
fi

if [[ " $* " == *" --simpletuner-size "* ]]; then
  # SimpleTuner 4.10.1 (Python >= 3.12 only) and the five largest of the ~45 required packages the image
  # lacks; the rest of its closure (spacy's and librosa's own dependencies, fastapi, ...) comes on top.
  scratch=$(mktemp -d)
  download "$scratch" simpletuner==4.10.1 faiss-cpu av spacy datasets torchcodec
  echo "SimpleTuner 4.10.1 and five of its missing requirements (not carried):"
  du -ch "$scratch"/*.whl | tail -n 1
  rm -rf "$scratch"
fi

if [[ " $* " == *" --sdscripts-aitoolkit-size "* ]]; then
  scratch=$(mktemp -d)
  # sd-scripts (48d368fa): library/config_util.py imports voluptuous, library/train_util.py imagesize and
  # cv2 (a later library/cv2_compat.py stubs cv2 when OpenCV is missing)
  download "$scratch/sd-scripts" voluptuous==0.15.2 imagesize==1.4.1
  # ai-toolkit (27a03a91): run.py imports dotenv, toolkit/config.py oyaml, toolkit/config_modules.py torchao,
  # toolkit/data_loader.py albumentations and cv2, toolkit/stable_diffusion_model.py optimum.quanto; its
  # diffusers is a git commit (no release) and its lycoris-lora 1.8.3 (.whl/ has 4.x)
  download "$scratch/ai-toolkit" python-dotenv oyaml==1.0 torchao==0.10.0 optimum-quanto==0.2.4 \
    albumentations==1.4.15 albucore==0.0.16 opencv-python-headless
  du -b "$scratch"/*/*.whl | sed "s|$scratch/||"
  du -ch "$scratch"/sd-scripts/*.whl | tail -n 1 | sed 's/total/sd-scripts, not counting OpenCV/'
  du -ch "$scratch"/ai-toolkit/*.whl | tail -n 1 | sed 's/total/ai-toolkit/'
  rm -rf "$scratch"
fi

du -sh .whl/peers/*
echo "carry total with the project's wheels (the limit is 64 MiB a call, the tree included):"
du -ch .whl/*.whl .whl/peers/*/*.whl | tail -n 1
