#!/usr/bin/env bash
# A LoRA smoke run of a preset with random weights and synthetic encoders: STEPS/2 steps, a checkpoint,
# then a resumed run to STEPS, with exports. Prints the run summary.
#   PRESET=moss-image-5b SIZE=1024 TPS=8704 bash scripts/bench/smoke_train.sh [extra kogine args]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
PRESET=${PRESET:-tiny} SIZE=${SIZE:-256} N=${N:-16} TPS=${TPS:-600} STEPS=${STEPS:-50}
WORK=${WORK:-/tmp/kohakumoss-smoke}
rm -rf "$WORK" && mkdir -p "$WORK"
$PY "$ROOT/scripts/bench/make_images.py" "$WORK/data" "$N" "$SIZE"
K=(--set MODEL_PRESET="$PRESET" --set TEXT_ENCODER=synthetic --set VAE=synthetic
   --set "DATASET={'kind':'kohya','path':'$WORK/data'}" --set AREA=$((SIZE * SIZE)) --set TOKENS_PER_STEP="$TPS"
   --set RUNS_DIR="$WORK/runs" --set RUN_NAME=smoke --set RANK=32 --set ALPHA=32 --set WORKERS=4
   --set CACHE_DIR="$WORK/cache" --set SAVE_EVERY=$((STEPS / 2)) --set LR=1e-4 "$@")
$PY -m kohakuengine.cli run "$ROOT/scripts/train/moss.py" "${K[@]}" --set STEPS="$STEPS" --set STOP_AT=$((STEPS / 2))
$PY -m kohakuengine.cli run "$ROOT/scripts/train/moss.py" "${K[@]}" --set STEPS="$STEPS" --set RESUME=latest
$PY "$ROOT/scripts/bench/summarize_run.py" "$WORK/runs/smoke" 5
