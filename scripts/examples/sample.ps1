<#
.SYNOPSIS
Sample images with adapters (or the base model): writes a checked config, then runs the sampler.
.EXAMPLE
.\scripts\examples\sample.ps1 -Weights ComfyUI\models -Adapter runs\examples\train\my_set\export\my_set-comfy.safetensors
.EXAMPLE
.\scripts\examples\sample.ps1 -Weights ComfyUI\models -Adapter a.safetensors, b.safetensors -Multiplier 1.0, 0.6 -Prompt "a fox"
.NOTES
Images go to runs\examples\sample\NAME\ (PNGs with their settings in the metadata, and grid.png).
$env:DRY_RUN = '1' prints the commands instead of running them. The same options as sample.sh.
#>
param(
    [Parameter(Mandatory = $true)][string]$Weights,
    [string[]]$Adapter = @(),
    [double[]]$Multiplier = @(),
    [string]$Prompt = 'a lighthouse on a rocky coast at sunset',
    [string]$Name = '',
    [int]$Count = 4,
    [int]$Seed = -1,
    [int]$Steps = 0,
    [double]$Cfg = -1,
    [string]$Size = '',
    [string]$Out = '',
    [string[]]$Set = @(),
    [switch]$NoCheck
)
$ErrorActionPreference = 'Continue'  # native tools' stderr must not stop the script; exit statuses are checked
$Example = 'sample.ps1'
. (Join-Path $PSScriptRoot 'common.ps1')

$Weights = Get-AbsPath $Weights 'weights folder'
$Adapter = @($Adapter | ForEach-Object { Get-AbsPath $_ 'adapter' })
if ($Multiplier.Count -gt $Adapter.Count) { Die '-Multiplier has more values than -Adapter' }
if (-not $Name) {
    if ($Adapter.Count -gt 0) { $Name = [IO.Path]::GetFileNameWithoutExtension($Adapter[0]) + '-sample' } else { $Name = 'base-sample' }
}
if ($Name -notmatch '^[A-Za-z0-9._-]+$') { Die "-Name '$Name' may hold only letters, digits, '.', '_' and '-'" }
if ($Size -and $Size -notmatch '^\d+x\d+$') { Die "-Size wants WIDTHxHEIGHT (for example 1024x768), got '$Size'" }

Set-Location $Root
$Base = "$ConfigDir/$Name.py"
$RunConfig = "$ConfigDir/${Name}_run.py"
if (-not $Out) { $Out = "runs/examples/sample/$Name" }
$ConfigTool = Find-ConfigTool

$Knobs = @('--str', "PROMPT=$Prompt", '--int', "COUNT=$Count", '--str', "OUT_DIR=$Out")
if ($Seed -ge 0) { $Knobs += @('--int', "SEED=$Seed") }
if ($Steps -gt 0) { $Knobs += @('--int', "STEPS=$Steps") }
if ($Cfg -ge 0) { $Knobs += @('--float', "CFG=$Cfg") }
if ($Size) { $w, $h = $Size -split 'x'; $Knobs += @('--int', "WIDTH=$w", '--int', "HEIGHT=$h") }
if ($Adapter.Count -gt 0) {
    for ($i = 0; $i -lt $Adapter.Count; $i++) {
        $m = 1.0
        if ($i -lt $Multiplier.Count) { $m = $Multiplier[$i] }
        $Knobs += @('--adapter', $Adapter[$i], '--multiplier', $m.ToString([Globalization.CultureInfo]::InvariantCulture))
    }
} else {
    $Knobs += @('--no-adapters')
}
$Knobs += Get-SetArgs $Set

if ($ConfigTool.Count -gt 0) {
    $New = @('new', 'sample', '--weights', $Weights, '--name', $Name, '--out-dir', $ConfigDir, '--force')
    if ($Adapter.Count -gt 0) { $New += @('--adapter', $Adapter[0]) }
    if ((Invoke-Step ($ConfigTool + $New)) -ne 0) { Die 'kohakumoss-config new sample failed (its message is above)' }
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--base', $Base) + $Knobs)
} else {
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--weights', $Weights) + $Knobs)
}
if ($rc -ne 0) { Die "could not write $RunConfig" }
Test-Config $RunConfig 'sample'

Say "sampling into $Out/"
exit (Invoke-Step ($Kogine + @('run', 'scripts/sample/sample.py', '--config', $RunConfig)))
