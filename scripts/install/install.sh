#!/usr/bin/env bash
# KohakuMoss installer (Linux): makes .venv, installs torch from the index that fits this GPU and
# driver, then KohakuMoss (editable, with its default extra and the dev tools), then runs the doctor.
#   bash scripts/install/install.sh [--cpu] [--index cu126|cu128|cu130|xpu|cpu] [--no-dev] [--python PY]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

INDEX_CHOICE="${KOHAKUMOSS_TORCH_INDEX:-auto}"
WITH_DEV=1
PYTHON="${KOHAKUMOSS_PYTHON:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) INDEX_CHOICE=cpu ;;
    --index) INDEX_CHOICE="$2"; shift ;;
    --no-dev) WITH_DEV=0 ;;
    --python) PYTHON="$2"; shift ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '[install] %s\n' "$*"; }

case "$INDEX_CHOICE" in
  auto|cu126|cu128|cu130|xpu|cpu) ;;
  *) echo "install.sh: --index / KOHAKUMOSS_TORCH_INDEX '$INDEX_CHOICE' is not one of auto, cu126, cu128, cu130, xpu, cpu" >&2; exit 2 ;;
esac

# --- Python: 3.12 where it exists, else the newest 3.10+ -------------------------------------
pick_python() {
  local c
  for c in python3.12 python3.13 python3.11 python3.10 python3; do
    if "$c" -c 'import sys; raise SystemExit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; then
      echo "$c"; return 0
    fi
  done
  return 1
}
if [[ -z "$PYTHON" ]]; then
  PYTHON=$(pick_python) || { echo "install.sh: no Python 3.10+ found; install python3.12 first" >&2; exit 1; }
fi
say "python: $($PYTHON --version 2>&1) ($PYTHON)"

# --- GPU and driver -> PyTorch index -----------------------------------------------------------
detect_index() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    local cuda
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1\2/p' | head -1)
    if [[ -z "$cuda" ]]; then echo cu126; return; fi
    if (( cuda >= 130 )); then echo cu130
    elif (( cuda >= 128 )); then echo cu128
    elif (( cuda >= 126 )); then echo cu126
    else echo "old-driver:$cuda"; fi
    return
  fi
  if ls /dev/dri/renderD* >/dev/null 2>&1 && command -v sycl-ls >/dev/null 2>&1 && sycl-ls 2>/dev/null | grep -qi 'level_zero:gpu'; then
    echo xpu; return
  fi
  # an Intel Arc card without oneAPI's sycl-ls: Intel's PCI vendor id and an Arc device id
  # (Alchemist 0x56xx, Battlemage 0xe20x); the torch xpu wheels bring their own runtime
  local dev vendor id
  for dev in "${KOHAKUMOSS_SYSFS:-/sys}"/class/drm/card*/device; do
    [[ -r "$dev/vendor" && -r "$dev/device" ]] || continue
    vendor=$(<"$dev/vendor"); id=$(<"$dev/device")
    if [[ "$vendor" == 0x8086 && ( "$id" == 0x56* || "$id" == 0xe20* ) ]]; then echo xpu; return; fi
  done
  echo cpu
}
if [[ "$INDEX_CHOICE" == auto ]]; then INDEX_CHOICE=$(detect_index); fi
if [[ "$INDEX_CHOICE" == old-driver:* ]]; then
  say "the NVIDIA driver supports CUDA ${INDEX_CHOICE#old-driver:} only; KohakuMoss needs a driver for CUDA 12.6+."
  say "update the driver, or rerun with --cpu. Continuing with the default index."
  INDEX_CHOICE=default
fi
EXTRAS=()
case "$INDEX_CHOICE" in
  cu126|cu128|cu130) EXTRAS+=(cuda) ;;
  xpu) EXTRAS+=(xpu) ;;
esac
[[ $WITH_DEV == 1 ]] && EXTRAS+=(dev)
EXTRA=$(IFS=,; echo "${EXTRAS[*]}")
PKG="."
[[ -n "$EXTRA" ]] && PKG=".[$EXTRA]"

INDEX_URL=""
if [[ "$INDEX_CHOICE" != default ]]; then
  INDEX_URL="https://download.pytorch.org/whl/$INDEX_CHOICE"
  if ! "$PYTHON" - "$INDEX_URL/" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=8)
PY
  then
    say "the PyTorch index $INDEX_URL cannot be reached; falling back to the default package index."
    INDEX_URL=""
  fi
fi
say "torch index: ${INDEX_URL:-default} (choice: $INDEX_CHOICE), extras: [$EXTRA]"

# --- venv and packages -------------------------------------------------------------------------
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip setuptools wheel 2>/dev/null || say "could not upgrade pip (offline?); using the venv's own"
TORCH_SPEC=("torch>=2.13,<2.15" "torchvision>=0.28,<0.30")
# newest versions the bounds allow, also into an existing .venv: a rerun (or CI on a kept venv) gets what a fresh install gets
FRESH=(--upgrade --upgrade-strategy eager)
if [[ -n "$INDEX_URL" ]]; then
  "$VPY" -m pip install "${FRESH[@]}" "${TORCH_SPEC[@]}" --index-url "$INDEX_URL"
else
  "$VPY" -m pip install "${FRESH[@]}" "${TORCH_SPEC[@]}"
fi
# the torch build just installed stays (an eager upgrade could swap it for another index's build)
read -ra KEEP_TORCH <<<"$("$VPY" -c 'from importlib.metadata import version as v; print("torch==" + v("torch"), "torchvision==" + v("torchvision"))')"
if [[ -n "$INDEX_URL" ]]; then
  "$VPY" -m pip install "${FRESH[@]}" -e "$PKG" "${KEEP_TORCH[@]}" --extra-index-url "$INDEX_URL"
else
  "$VPY" -m pip install "${FRESH[@]}" -e "$PKG" "${KEEP_TORCH[@]}"
fi

say "installed; checking the environment"
if "$VPY" -c 'import kohakumoss.cli.doctor' >/dev/null 2>&1; then
  "$VPY" -m kohakumoss.cli.doctor || say "the doctor reported problems above (training may still work on the CPU)"
fi
say "done. activate with: source .venv/bin/activate"
