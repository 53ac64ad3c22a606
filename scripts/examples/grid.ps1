<#
.SYNOPSIS
Sample the checkpoints of a training run into one grid: a row for the base model and one per checkpoint.
.EXAMPLE
.\scripts\examples\grid.ps1 -Weights ComfyUI\models -Run my_set -Checkpoints -Prompt "a lighthouse at dusk"
.EXAMPLE
.\scripts\examples\grid.ps1 -Weights ComfyUI\models -Run my_set -Only step_00000010, step_00000030 -Seeds 0, 1
.NOTES
Without -Checkpoints or -Only: the base row and the run's last checkpoint. Writes OUT\grid.png
(default OUT: runs\examples\grid\RUN). $env:DRY_RUN = '1' prints the commands instead of running them.
The same options as grid.sh.
#>
param(
    [Parameter(Mandatory = $true)][string]$Weights,
    [Parameter(Mandatory = $true)][string]$Run,
    [switch]$Checkpoints,
    [string[]]$Only = @(),
    [string]$Prompt = 'a lighthouse on a rocky coast at sunset',
    [int[]]$Seeds = @(0, 1, 2, 3),
    [int]$Steps = 0,
    [double]$Cfg = -1,
    [string]$Size = '',
    [string]$RunsDir = 'runs/examples/train',
    [string]$Out = '',
    [switch]$NoBase,
    [string[]]$Set = @(),
    [switch]$NoCheck
)
$ErrorActionPreference = 'Continue'  # native tools' stderr must not stop the script; exit statuses are checked
$Example = 'grid.ps1'
. (Join-Path $PSScriptRoot 'common.ps1')

if ($Size -and $Size -notmatch '^\d+x\d+$') { Die "-Size wants WIDTHxHEIGHT (for example 1024x768), got '$Size'" }
$Weights = Get-AbsPath $Weights 'weights folder'
Set-Location $Root
$RunDir = Get-AbsPath (Join-Path $RunsDir $Run) 'run folder'
if (-not $Out) { $Out = "runs/examples/grid/$Run" }

# The run's complete checkpoints (step_<digits>\ holding meta.json), oldest first.
$CkptRoot = Join-Path $RunDir 'checkpoints'
$Ckpts = @()
if (Test-Path -LiteralPath $CkptRoot) {
    $Ckpts = @(Get-ChildItem -LiteralPath $CkptRoot -Directory | Where-Object { $_.Name -match '^step_\d+$' -and (Test-Path (Join-Path $_.FullName 'meta.json')) } | Sort-Object Name | ForEach-Object { $_.FullName })
}
if ($Ckpts.Count -eq 0) { Die "no checkpoints in $CkptRoot (train with -SaveEvery N to get some)" }
if ($Only.Count -gt 0) {
    $Rows = @()
    foreach ($w in $Only) {
        $dir = Join-Path $CkptRoot $w
        if (-not (Test-Path (Join-Path $dir 'meta.json'))) {
            Die "no checkpoint '$w' in $CkptRoot (has: $((($Ckpts | ForEach-Object { Split-Path -Leaf $_ }) -join ', ')))"
        }
        $Rows += $dir
    }
} elseif ($Checkpoints) {
    $Rows = $Ckpts
} else {
    $Rows = @($Ckpts[-1])
}
$labels = @($Rows | ForEach-Object { Split-Path -Leaf $_ })
if (-not $NoBase) { $labels = @('base') + $labels }
Say ('rows: ' + ($labels -join ' '))

$Name = "$Run-grid"
$Base = "$ConfigDir/$Name.py"
$RunConfig = "$ConfigDir/${Name}_run.py"
$ConfigTool = Find-ConfigTool
$Knobs = @('--str', "PROMPT=$Prompt", '--ints', ('SEEDS=' + ($Seeds -join ',')), '--bool', 'GRID=false')
if ($Steps -gt 0) { $Knobs += @('--int', "STEPS=$Steps") }
if ($Cfg -ge 0) { $Knobs += @('--float', "CFG=$Cfg") }
if ($Size) { $w, $h = $Size -split 'x'; $Knobs += @('--int', "WIDTH=$w", '--int', "HEIGHT=$h") }
$Knobs += Get-SetArgs $Set
if ($ConfigTool.Count -gt 0) {
    $New = @('new', 'sample', '--weights', $Weights, '--name', $Name, '--out-dir', $ConfigDir, '--force')
    if ((Invoke-Step ($ConfigTool + $New)) -ne 0) { Die 'kohakumoss-config new sample failed (its message is above)' }
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--base', $Base) + $Knobs + @('--no-adapters'))
} else {
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--weights', $Weights) + $Knobs + @('--no-adapters'))
}
if ($rc -ne 0) { Die "could not write $RunConfig" }
Test-Config $RunConfig 'sample'

# One sampler run per row (each loads the model once); a row config adds its ADAPTERS and OUT_DIR.
$RowDirs = @()
function Invoke-Row([string]$Label, [string[]]$Extra) {
    $cfg = "$Out/configs/$Label.py"
    $rc = Invoke-Step ($WriteConfig + @('write', $cfg, '--base', $RunConfig, '--str', "OUT_DIR=$Out/$Label") + $Extra)
    if ($rc -ne 0) { Die "could not write $cfg" }
    if ((Invoke-Step ($Kogine + @('run', 'scripts/sample/sample.py', '--config', $cfg))) -ne 0) { Die "sampling the row '$Label' failed (the message is above)" }
    return "$Out/$Label"
}
if (-not $NoBase) { $RowDirs += Invoke-Row 'base' @('--no-adapters') }
foreach ($r in $Rows) { $RowDirs += Invoke-Row (Split-Path -Leaf $r) @('--adapter', $r) }
if ((Invoke-Step ($Py + @('scripts/examples/stack_grid.py', "$Out/grid.png") + $RowDirs)) -ne 0) { Die 'could not stack the grid' }
Say "grid: $Out/grid.png"
