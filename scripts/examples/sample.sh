#!/usr/bin/env bash
# Sample images with an adapter (or the base model): writes a checked config, then runs the sampler.
#   bash scripts/examples/sample.sh --weights DIR [--adapter FILE_OR_CHECKPOINT [--multiplier M]]...
#       [--prompt TEXT] [--name NAME] [--count N] [--seed N] [--steps N] [--cfg X] [--size WxH]
#       [--out DIR] [--set KNOB=VALUE]... [--no-check]
# Images go to runs/examples/sample/NAME/ (PNGs with their settings in the metadata, and grid.png).
set -euo pipefail
EXAMPLE=sample.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WEIGHTS="" NAME="" PROMPT="a lighthouse on a rocky coast at sunset" COUNT=4 SEED="" STEPS="" CFG="" SIZE="" OUT=""
ADAPTERS=() MULTS=() SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --weights) WEIGHTS="$2"; shift ;;
    --adapter) ADAPTERS+=("$2"); MULTS+=(1.0); shift ;;
    --multiplier) [[ ${#ADAPTERS[@]} -gt 0 ]] || die "--multiplier comes after the --adapter it scales"
                  MULTS[${#MULTS[@]}-1]="$2"; shift ;;
    --prompt) PROMPT="$2"; shift ;;
    --name) NAME="$2"; shift ;;
    --count) COUNT="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --cfg) CFG="$2"; shift ;;
    --size) SIZE="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --set) SETS+=(--set "$2"); shift ;;
    --no-check) NO_CHECK=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[[ -n "$WEIGHTS" ]] || die "--weights DIR is required (a ComfyUI models folder or an HF snapshot)"
WEIGHTS=$(abspath "$WEIGHTS" "weights folder")
for i in "${!ADAPTERS[@]}"; do ADAPTERS[i]=$(abspath "${ADAPTERS[i]}" "adapter"); done
if [[ -z "$NAME" ]]; then
  if [[ ${#ADAPTERS[@]} -gt 0 ]]; then NAME="$(basename "${ADAPTERS[0]}" .safetensors)-sample"; else NAME=base-sample; fi
fi
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name '$NAME' may hold only letters, digits, '.', '_' and '-'"
for n in COUNT SEED STEPS; do
  [[ -z "${!n}" || "${!n}" =~ ^[0-9]+$ ]] || die "--${n,,} wants a whole number, got '${!n}'"
done
[[ -z "$SIZE" || "$SIZE" =~ ^[0-9]+x[0-9]+$ ]] || die "--size wants WIDTHxHEIGHT (for example 1024x768), got '$SIZE'"

cd "$ROOT"
BASE="$CONFIG_DIR/$NAME.py"
RUN_CONFIG="$CONFIG_DIR/${NAME}_run.py"
OUT=${OUT:-runs/examples/sample/$NAME}
find_config_tool

KNOBS=(--str "PROMPT=$PROMPT" --int "COUNT=$COUNT" --str "OUT_DIR=$OUT")
[[ -n "$SEED" ]] && KNOBS+=(--int "SEED=$SEED")
[[ -n "$STEPS" ]] && KNOBS+=(--int "STEPS=$STEPS")
[[ -n "$CFG" ]] && KNOBS+=(--float "CFG=$CFG")
[[ -n "$SIZE" ]] && KNOBS+=(--int "WIDTH=${SIZE%x*}" --int "HEIGHT=${SIZE#*x}")
if [[ ${#ADAPTERS[@]} -gt 0 ]]; then
  for i in "${!ADAPTERS[@]}"; do KNOBS+=(--adapter "${ADAPTERS[i]}" --multiplier "${MULTS[i]}"); done
else
  KNOBS+=(--no-adapters)
fi
KNOBS+=(${SETS[@]+"${SETS[@]}"})

if [[ ${#CONFIG_TOOL[@]} -gt 0 ]]; then
  NEW=(new sample --weights "$WEIGHTS" --name "$NAME" --out-dir "$CONFIG_DIR" --force)
  [[ ${#ADAPTERS[@]} -gt 0 ]] && NEW+=(--adapter "${ADAPTERS[0]}")
  run "${CONFIG_TOOL[@]}" "${NEW[@]}" || die "kohakumoss-config new sample failed (its message is above)"
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --base "$BASE" "${KNOBS[@]}"
else
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --weights "$WEIGHTS" "${KNOBS[@]}"
fi
check_config "$RUN_CONFIG" sample

say "sampling into $OUT/"
run "${KOGINE[@]}" run scripts/sample/sample.py --config "$RUN_CONFIG"
