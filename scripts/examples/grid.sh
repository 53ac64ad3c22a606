#!/usr/bin/env bash
# Sample the checkpoints of a training run into one grid: a row for the base model and one per
# checkpoint (the checkpoint as ADAPTERS), the same prompt and seeds in every row.
#   bash scripts/examples/grid.sh --weights DIR --run NAME [--checkpoints] [--only step_00000010,step_00000020]
#       [--prompt TEXT] [--seeds 0,1,2,3] [--steps N] [--cfg X] [--size WxH] [--runs-dir DIR]
#       [--out DIR] [--no-base] [--set KNOB=VALUE]... [--no-check]
# Without --checkpoints or --only: the base row and the run's last checkpoint. Writes OUT/grid.png
# (default OUT: runs/examples/grid/NAME). DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail
EXAMPLE=grid.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WEIGHTS="" RUN="" RUNS_DIR=runs/examples/train ALL=0 ONLY="" PROMPT="a lighthouse on a rocky coast at sunset"
SEEDS=0,1,2,3 STEPS="" CFG="" SIZE="" OUT="" BASE_ROW=1
SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --weights) WEIGHTS="$2"; shift ;;
    --run) RUN="$2"; shift ;;
    --runs-dir) RUNS_DIR="$2"; shift ;;
    --checkpoints) ALL=1 ;;
    --only) ONLY="$2"; shift ;;
    --prompt) PROMPT="$2"; shift ;;
    --seeds) SEEDS="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --cfg) CFG="$2"; shift ;;
    --size) SIZE="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --no-base) BASE_ROW=0 ;;
    --set) SETS+=(--set "$2"); shift ;;
    --no-check) NO_CHECK=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[[ -n "$WEIGHTS" ]] || die "--weights DIR is required (the base model the run trained on)"
[[ -n "$RUN" ]] || die "--run NAME is required (a run folder under $RUNS_DIR)"
[[ "$SEEDS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--seeds wants whole numbers separated by commas, got '$SEEDS'"
[[ -z "$STEPS" || "$STEPS" =~ ^[0-9]+$ ]] || die "--steps wants a whole number, got '$STEPS'"
[[ -z "$SIZE" || "$SIZE" =~ ^[0-9]+x[0-9]+$ ]] || die "--size wants WIDTHxHEIGHT (for example 1024x768), got '$SIZE'"
WEIGHTS=$(abspath "$WEIGHTS" "weights folder")
cd "$ROOT"
RUN_DIR=$(abspath "$RUNS_DIR/$RUN" "run folder")
OUT=${OUT:-runs/examples/grid/$RUN}

# The run's complete checkpoints (step_<digits>/ holding meta.json), oldest first.
CKPTS=()
for d in "$RUN_DIR"/checkpoints/step_*; do
  [[ -f "$d/meta.json" ]] && CKPTS+=("$d")
done
[[ ${#CKPTS[@]} -gt 0 ]] || die "no checkpoints in $RUN_DIR/checkpoints (train with --save-every N to get some)"
if [[ -n "$ONLY" ]]; then
  ROWS=()
  IFS=, read -r -a WANT <<<"$ONLY"
  for w in "${WANT[@]}"; do
    [[ -f "$RUN_DIR/checkpoints/$w/meta.json" ]] || die "no checkpoint '$w' in $RUN_DIR/checkpoints (has: $(cd "$RUN_DIR/checkpoints" && echo step_*))"
    ROWS+=("$RUN_DIR/checkpoints/$w")
  done
elif [[ $ALL == 1 ]]; then
  ROWS=("${CKPTS[@]}")
else
  ROWS=("${CKPTS[${#CKPTS[@]}-1]}")
fi
say "rows: $([[ $BASE_ROW == 1 ]] && printf 'base ')$(for r in "${ROWS[@]}"; do printf '%s ' "$(basename "$r")"; done)"

NAME="$RUN-grid"
BASE="$CONFIG_DIR/$NAME.py"
RUN_CONFIG="$CONFIG_DIR/${NAME}_run.py"
find_config_tool
KNOBS=(--str "PROMPT=$PROMPT" --ints "SEEDS=$SEEDS" --bool GRID=false)
[[ -n "$STEPS" ]] && KNOBS+=(--int "STEPS=$STEPS")
[[ -n "$CFG" ]] && KNOBS+=(--float "CFG=$CFG")
[[ -n "$SIZE" ]] && KNOBS+=(--int "WIDTH=${SIZE%x*}" --int "HEIGHT=${SIZE#*x}")
KNOBS+=(${SETS[@]+"${SETS[@]}"})
if [[ ${#CONFIG_TOOL[@]} -gt 0 ]]; then
  run "${CONFIG_TOOL[@]}" new sample --weights "$WEIGHTS" --name "$NAME" --out-dir "$CONFIG_DIR" --force \
    || die "kohakumoss-config new sample failed (its message is above)"
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --base "$BASE" "${KNOBS[@]}" --no-adapters
else
  run "${WRITE_CONFIG[@]}" write "$RUN_CONFIG" --weights "$WEIGHTS" "${KNOBS[@]}" --no-adapters
fi
check_config "$RUN_CONFIG" sample

# One sampler run per row (each loads the model once); a row config adds its ADAPTERS and OUT_DIR.
ROW_DIRS=()
sample_row() {
  local label="$1"; shift
  local cfg="$OUT/configs/$label.py"
  run "${WRITE_CONFIG[@]}" write "$cfg" --base "$RUN_CONFIG" --str "OUT_DIR=$OUT/$label" "$@"
  run "${KOGINE[@]}" run scripts/sample/sample.py --config "$cfg"
  ROW_DIRS+=("$OUT/$label")
}
[[ $BASE_ROW == 1 ]] && sample_row base --no-adapters
for r in "${ROWS[@]}"; do sample_row "$(basename "$r")" --adapter "$r"; done
run "$PY" scripts/examples/stack_grid.py "$OUT/grid.png" "${ROW_DIRS[@]}"
say "grid: $OUT/grid.png"
