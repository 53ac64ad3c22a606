#!/usr/bin/env bash
# Train an adapter from a handful of options: writes a checked config, then starts the run.
#   bash scripts/examples/train.sh --weights DIR --dataset DIR [--name NAME] [--steps N] [--sample-every N]
#       [--save-every N] [--keep-last N] [--prompt TEXT]... [--algo ALGO] [--source KIND] [--gpu auto|NAME|GB] [--resume]
#       [--cache] [--set KNOB=VALUE]... [--no-check]
# --cache fills the text and latent caches first (done without it where the GPU layer trains from the caches only:
# the 6-12 GB layers).
# --set values go into the written config (so the check sees them); --no-check runs despite problems.
# The run goes to runs/examples/train/NAME/. DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail
EXAMPLE=train.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WEIGHTS="" DATASET="" NAME="" STEPS="" SAMPLE_EVERY="" SAVE_EVERY="" KEEP_LAST=5 ALGO="" SOURCE="" GPU=auto RESUME=0 CACHE=0
PROMPTS=() SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --weights) WEIGHTS="$2"; shift ;;
    --dataset|--data) DATASET="$2"; shift ;;
    --name) NAME="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --sample-every) SAMPLE_EVERY="$2"; shift ;;
    --save-every) SAVE_EVERY="$2"; shift ;;
    --keep-last) KEEP_LAST="$2"; shift ;;
    --prompt) PROMPTS+=("$2"); shift ;;
    --algo) ALGO="$2"; shift ;;
    --source) SOURCE="$2"; shift ;;
    --gpu) GPU="$2"; shift ;;
    --resume) RESUME=1 ;;
    --cache) CACHE=1 ;;
    --set) SETS+=(--set "$2"); shift ;;
    --no-check) NO_CHECK=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[[ -n "$WEIGHTS" ]] || die "--weights DIR is required (a ComfyUI models folder or an HF snapshot)"
[[ -n "$DATASET" ]] || die "--dataset DIR is required (kohya-style folders of images + .txt captions)"
WEIGHTS=$(abspath "$WEIGHTS" "weights folder")
DATASET=$(abspath "$DATASET" "dataset folder")
NAME=${NAME:-$(basename "$DATASET")}
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name '$NAME' may hold only letters, digits, '.', '_' and '-'"
for n in STEPS SAMPLE_EVERY SAVE_EVERY KEEP_LAST; do
  [[ -z "${!n}" || "${!n}" =~ ^[0-9]+$ ]] || die "--$(tr 'A-Z_' 'a-z-' <<<"$n") wants a whole number, got '${!n}'"
done
# Checkpoints at the sample interval unless told otherwise, so grid.sh has a row per sample point.
[[ -z "$SAVE_EVERY" && -n "$SAMPLE_EVERY" ]] && SAVE_EVERY="$SAMPLE_EVERY"

cd "$ROOT"
BASE="$CONFIG_DIR/$NAME.py"
RUN_CONFIG="$CONFIG_DIR/${NAME}_run.py"
DATA_CONFIG="$CONFIG_DIR/${NAME}_run_data.py"  # the data scripts' config, read from RUN_CONFIG
find_config_tool

# SAVE_FORMAT both: the ComfyUI file for ComfyUI, the LyCORIS file for LyCORIS-based tools (sample.sh
# reads either).
KNOBS=(--str "RUN_NAME=$NAME" --str RUNS_DIR=runs/examples/train --int "KEEP_LAST=$KEEP_LAST" --str SAVE_FORMAT=both)
[[ -n "$STEPS" ]] && KNOBS+=(--int "STEPS=$STEPS")
[[ -n "$SAMPLE_EVERY" ]] && KNOBS+=(--int "SAMPLE_EVERY=$SAMPLE_EVERY")
[[ -n "$SAVE_EVERY" ]] && KNOBS+=(--int "SAVE_EVERY=$SAVE_EVERY")
if [[ ${#PROMPTS[@]} -gt 0 ]]; then
  for p in "${PROMPTS[@]}"; do KNOBS+=(--item "SAMPLE_PROMPTS=$p"); done
else
  KNOBS+=(--prompts-from "SAMPLE_PROMPTS=$DATASET")  # the dataset's first two captions
fi
KNOBS+=(${SETS[@]+"${SETS[@]}"})

if [[ ${#CONFIG_TOOL[@]} -gt 0 ]]; then
  NEW=(new train --weights "$WEIGHTS" --data "$DATASET" --name "$NAME" --gpu "$GPU" --out-dir "$CONFIG_DIR" --force)
  [[ -n "$ALGO" ]] && NEW+=(--algo "$ALGO")
  [[ -n "$SOURCE" ]] && NEW+=(--source "$SOURCE")
  run "${CONFIG_TOOL[@]}" "${NEW[@]}" || die "kohakumoss-config new train failed (its message is above)"
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --base "$BASE" "${KNOBS[@]}"
  # the data config of the run's own config: --set plan and encoder knobs reach the caches too
  run "${CONFIG_TOOL[@]}" new data --train "$RUN_CONFIG" --name "${NAME}_run" --out-dir "$CONFIG_DIR" --force \
    || die "kohakumoss-config new data failed (its message is above)"
else
  [[ -n "$ALGO" ]] && KNOBS+=(--str "ALGO=$ALGO")
  [[ -n "$SOURCE" ]] && KNOBS+=(--source "$SOURCE")
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --weights "$WEIGHTS" --data "$DATASET" "${KNOBS[@]}"
fi
check_config "$RUN_CONFIG" train

# the 6-12 GB layers train from the caches only (VAE_ENCODE / TEXT_ENCODE 'cache'): fill them without --cache too
if [[ $CACHE == 0 && ${#CONFIG_TOOL[@]} -gt 0 ]] && FROM_CACHE=$("${WRITE_CONFIG[@]}" needs-cache "$RUN_CONFIG" 2>/dev/null); then
  say "this GPU layer trains from the caches only ($FROM_CACHE): filling them first, as --cache does"
  CACHE=1
fi
if [[ $CACHE == 1 ]]; then
  if [[ ${#CONFIG_TOOL[@]} -gt 0 ]]; then
    for s in cache_text cache_latents; do
      run "${KOGINE[@]}" run "scripts/data/$s.py" --config "$DATA_CONFIG" || die "scripts/data/$s.py failed (its message is above)"
    done
  else
    say "--cache needs the data config that kohakumoss-config writes; training encodes what is missing instead"
  fi
fi

RESUME_SET=()
[[ $RESUME == 1 ]] && RESUME_SET=(--set RESUME=latest)
[[ ${#CONFIG_TOOL[@]} -gt 0 ]] && say "data config for inspect_data / cache_text / cache_latents: $DATA_CONFIG"
say "training: runs/examples/train/$NAME/ (log.txt, metrics.jsonl, samples/, checkpoints/, export/)"
run "${KOGINE[@]}" run scripts/train/moss.py --config "$RUN_CONFIG" ${RESUME_SET[@]+"${RESUME_SET[@]}"}
