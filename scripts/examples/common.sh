# Shared by the example scripts (sourced, not run): the Python to use, the config tool, dry runs.
#   PYTHON=...              the Python of the KohakuMoss environment (default: .venv's, else python3)
#   KOHAKUMOSS_CONFIG=...   the config tool command (default: found; 'none' acts as if it were missing)
#   DRY_RUN=1               print every command instead of running it

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

say() { printf '[%s] %s\n' "$EXAMPLE" "$*"; }
die() { printf '[%s] error: %s\n' "$EXAMPLE" "$*" >&2; exit 2; }

# run CMD...: the command, or with DRY_RUN=1 its shell-quoted line after '+ '.
run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

# An absolute path of an existing file or folder (the scripts run from the repository root).
abspath() {
  local p="$1" what="$2"
  [[ -e "$p" ]] || die "$what '$p' does not exist"
  if [[ -d "$p" ]]; then (cd "$p" && pwd); else printf '%s/%s\n' "$(cd "$(dirname "$p")" && pwd)" "$(basename "$p")"; fi
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"
  elif [[ -x "$ROOT/.venv/bin/python" ]]; then echo "$ROOT/.venv/bin/python"
  elif [[ -x "$ROOT/.venv/Scripts/python.exe" ]]; then echo "$ROOT/.venv/Scripts/python.exe"
  else echo python3; fi
}
PY=$(pick_python)
KOGINE=("$PY" -m kohakuengine.cli)  # kogine of this Python's environment
WRITE_CONFIG=("$PY" "$ROOT/scripts/examples/write_config.py")

# The configs of the examples live in their own folder, so rerunning one (which rewrites its files,
# --force) never touches a config you wrote yourself under configs/user/.
CONFIG_DIR=configs/user/examples

# CONFIG_TOOL: the kohakumoss-config command as an array; empty when the tool is not installed.
CONFIG_TOOL=()
find_config_tool() {
  if [[ -n "${KOHAKUMOSS_CONFIG:-}" ]]; then
    [[ "$KOHAKUMOSS_CONFIG" == none ]] || read -r -a CONFIG_TOOL <<<"$KOHAKUMOSS_CONFIG"
  elif "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("kohakumoss.cli.config_tool") is None)' >/dev/null 2>&1; then
    CONFIG_TOOL=("$PY" -m kohakumoss.cli.config_tool)
  elif command -v kohakumoss-config >/dev/null 2>&1; then
    CONFIG_TOOL=(kohakumoss-config)
  fi
  if [[ ${#CONFIG_TOOL[@]} -eq 0 ]]; then
    say "kohakumoss-config is not installed in this environment ($PY); writing a plain config from the"
    say "options instead (no GPU layer or memory profile is chosen; the script's own knob check still runs)."
    say "to get the tool: update the clone, then run the installer again (it reinstalls the package)."
  fi
}

# check_config FILE train|sample: kohakumoss-config check, else the schema check of write_config.py.
# With NO_CHECK=1 (the scripts' --no-check) the problems are printed and the run goes ahead.
check_config() {
  local checker=("${WRITE_CONFIG[@]}")
  [[ ${#CONFIG_TOOL[@]} -gt 0 ]] && checker=("${CONFIG_TOOL[@]}")
  run "${checker[@]}" check "$1" --script "$2" && return 0
  if [[ "${NO_CHECK:-0}" == 1 ]]; then
    say "the check found problems in $1 (listed above); running anyway (--no-check)"
  else
    die "the check found problems in $1 (listed above): change them with --set KNOB=VALUE, or pass --no-check to run anyway"
  fi
}
