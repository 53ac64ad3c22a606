# Shared by the example scripts (dot-sourced, not run): the Python to use, the config tool, dry runs.
#   $env:PYTHON             the Python of the KohakuMoss environment (default: .venv's, else py / python)
#   $env:KOHAKUMOSS_CONFIG  the config tool command (default: found; 'none' acts as if it were missing)
#   $env:DRY_RUN = '1'      print every command instead of running it
# Windows PowerShell 5.1 and PowerShell 7 both work.

$Root = (Resolve-Path (Join-Path $PSScriptRoot '..\..')).Path

function Say([string]$Text) { Write-Host "[$Example] $Text" }
function Die([string]$Text) {
    Write-Host "[$Example] error: $Text" -ForegroundColor Red
    exit 2
}

# PowerShell before 7.3 drops the double quotes inside a native command's argument; escape them.
$LegacyArgs = $PSVersionTable.PSVersion -lt [version]'7.3'
function Format-NativeArg([string]$Arg) {
    if ($LegacyArgs) { return $Arg.Replace('"', '\"') }
    return $Arg
}

# Invoke-Step CMD...: the command (returns its exit status), or with DRY_RUN=1 its line after '+ '.
function Invoke-Step {
    param([Parameter(Mandatory = $true)][string[]]$Command)
    if ($env:DRY_RUN -eq '1') {
        $shown = $Command | ForEach-Object { if ($_ -match '[\s"'']') { "'" + $_.Replace("'", "''") + "'" } else { $_ } }
        Write-Host ('+ ' + ($shown -join ' '))
        return 0
    }
    $exe = $Command[0]
    $rest = @()
    if ($Command.Count -gt 1) { $rest = @($Command[1..($Command.Count - 1)] | ForEach-Object { Format-NativeArg $_ }) }
    & $exe @rest | Out-Host
    return $LASTEXITCODE
}

# An absolute path of an existing file or folder (the scripts run from the repository root).
function Get-AbsPath([string]$Path, [string]$What) {
    if (-not $Path -or -not (Test-Path -LiteralPath $Path)) { Die "$What '$Path' does not exist" }
    return (Resolve-Path -LiteralPath $Path).Path
}

function Find-Python {
    if ($env:PYTHON) { return @($env:PYTHON) }
    $venv = Join-Path $Root '.venv\Scripts\python.exe'
    if (Test-Path $venv) { return @($venv) }
    $venv = Join-Path $Root '.venv/bin/python'
    if (Test-Path $venv) { return @($venv) }
    if (Get-Command py -ErrorAction SilentlyContinue) { return @('py', '-3') }
    return @('python')
}
$Py = @(Find-Python)
$Kogine = $Py + @('-m', 'kohakuengine.cli')  # kogine of this Python's environment
$WriteConfig = $Py + @((Join-Path $Root 'scripts\examples\write_config.py'))

# The configs of the examples live in their own folder, so rerunning one (which rewrites its files,
# --force) never touches a config you wrote yourself under configs/user/.
$ConfigDir = 'configs/user/examples'

# $ConfigTool: the kohakumoss-config command as an array; empty when the tool is not installed.
function Find-ConfigTool {
    if ($env:KOHAKUMOSS_CONFIG) {
        if ($env:KOHAKUMOSS_CONFIG -eq 'none') { $tool = @() } else { $tool = @($env:KOHAKUMOSS_CONFIG -split '\s+') }
    } else {
        $exe = $Py[0]
        $pre = @()
        if ($Py.Count -gt 1) { $pre = $Py[1..($Py.Count - 1)] }
        & $exe @pre -c 'import importlib.util as u, sys; sys.exit(u.find_spec(''kohakumoss.cli.config_tool'') is None)' 2>$null | Out-Null
        if ($LASTEXITCODE -eq 0) { $tool = $Py + @('-m', 'kohakumoss.cli.config_tool') }
        elseif (Get-Command kohakumoss-config -ErrorAction SilentlyContinue) { $tool = @('kohakumoss-config') }
        else { $tool = @() }
    }
    if ($tool.Count -eq 0) {
        Say "kohakumoss-config is not installed in this environment ($($Py -join ' ')); writing a plain config from the"
        Say "options instead (no GPU layer or memory profile is chosen; the script's own knob check still runs)."
        Say "to get the tool: update the clone, then run scripts\install\install.ps1 again (it reinstalls the package)."
    }
    return , $tool
}

# Test-Config FILE train|sample: kohakumoss-config check, else the schema check of write_config.py.
# With -NoCheck the problems are printed and the run goes ahead.
function Test-Config([string]$File, [string]$Script) {
    $checker = $WriteConfig
    if ($ConfigTool.Count -gt 0) { $checker = $ConfigTool }
    if ((Invoke-Step ($checker + @('check', $File, '--script', $Script))) -eq 0) { return }
    if ($NoCheck) { Say "the check found problems in $File (listed above); running anyway (-NoCheck)" }
    else { Die "the check found problems in $File (listed above): change them with -Set KNOB=VALUE, or pass -NoCheck to run anyway" }
}

# -Set KNOB=VALUE entries as write_config.py arguments (they go into the written config, so the check sees them).
function Get-SetArgs([string[]]$Set) {
    $out = @()
    foreach ($s in $Set) { $out += @('--set', $s) }
    return , $out
}
