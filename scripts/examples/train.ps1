<#
.SYNOPSIS
Train an adapter from a handful of options: writes a checked config, then starts the run.
.EXAMPLE
.\scripts\examples\train.ps1 -Weights ComfyUI\models -Dataset D:\data\my_set -Steps 30 -SampleEvery 10
.NOTES
The run goes to runs\examples\train\NAME\. $env:DRY_RUN = '1' prints the commands instead of running them.
The same options as train.sh (-Weights, -Dataset, -Name, -Steps, -SampleEvery, -SaveEvery, -KeepLast,
-Prompt, -Algo, -Source, -Gpu, -Resume, -Cache, -Set, -NoCheck). -Cache fills the text and latent caches
first (done without it where the GPU layer trains from the caches only: the 6-12 GB layers). -Set values go into the written config (so the
check sees them); -NoCheck runs despite the check's problems.
#>
param(
    [Parameter(Mandatory = $true)][string]$Weights,
    [Parameter(Mandatory = $true)][Alias('Data')][string]$Dataset,
    [string]$Name = '',
    [int]$Steps = 0,
    [int]$SampleEvery = -1,
    [int]$SaveEvery = -1,
    [int]$KeepLast = 5,
    [string[]]$Prompt = @(),
    [string]$Algo = '',
    [ValidateSet('kohya', 'folder', 'jsonl', 'parquet', 'webdataset', 'shards')][string]$Source = '',
    [string]$Gpu = 'auto',
    [switch]$Resume,
    [switch]$Cache,
    [string[]]$Set = @(),
    [switch]$NoCheck
)
$ErrorActionPreference = 'Continue'  # native tools' stderr must not stop the script; exit statuses are checked
$Example = 'train.ps1'
. (Join-Path $PSScriptRoot 'common.ps1')

$Weights = Get-AbsPath $Weights 'weights folder'
$Dataset = Get-AbsPath $Dataset 'dataset folder'
if (-not $Name) { $Name = Split-Path -Leaf $Dataset }
if ($Name -notmatch '^[A-Za-z0-9._-]+$') { Die "-Name '$Name' may hold only letters, digits, '.', '_' and '-'" }
# Checkpoints at the sample interval unless told otherwise, so grid.ps1 has a row per sample point.
if ($SaveEvery -lt 0 -and $SampleEvery -ge 0) { $SaveEvery = $SampleEvery }

Set-Location $Root
$Base = "$ConfigDir/$Name.py"
$RunConfig = "$ConfigDir/${Name}_run.py"
$DataConfig = "$ConfigDir/${Name}_run_data.py"  # the data scripts' config, read from $RunConfig
$ConfigTool = Find-ConfigTool

# SAVE_FORMAT both: the ComfyUI file for ComfyUI, the LyCORIS file for LyCORIS-based tools (sample.ps1
# reads either).
$Knobs = @('--str', "RUN_NAME=$Name", '--str', 'RUNS_DIR=runs/examples/train', '--int', "KEEP_LAST=$KeepLast", '--str', 'SAVE_FORMAT=both')
if ($Steps -gt 0) { $Knobs += @('--int', "STEPS=$Steps") }
if ($SampleEvery -ge 0) { $Knobs += @('--int', "SAMPLE_EVERY=$SampleEvery") }
if ($SaveEvery -ge 0) { $Knobs += @('--int', "SAVE_EVERY=$SaveEvery") }
if ($Prompt.Count -gt 0) {
    foreach ($p in $Prompt) { $Knobs += @('--item', "SAMPLE_PROMPTS=$p") }
} else {
    $Knobs += @('--prompts-from', "SAMPLE_PROMPTS=$Dataset")  # the dataset's first two captions
}
$Knobs += Get-SetArgs $Set

if ($ConfigTool.Count -gt 0) {
    $New = @('new', 'train', '--weights', $Weights, '--data', $Dataset, '--name', $Name, '--gpu', $Gpu, '--out-dir', $ConfigDir, '--force')
    if ($Algo) { $New += @('--algo', $Algo) }
    if ($Source) { $New += @('--source', $Source) }
    if ((Invoke-Step ($ConfigTool + $New)) -ne 0) { Die 'kohakumoss-config new train failed (its message is above)' }
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--base', $Base) + $Knobs)
    if ($rc -ne 0) { Die "could not write $RunConfig" }
    # the data config of the run's own config: -Set plan and encoder knobs reach the caches too
    $NewData = @('new', 'data', '--train', $RunConfig, '--name', "${Name}_run", '--out-dir', $ConfigDir, '--force')
    if ((Invoke-Step ($ConfigTool + $NewData)) -ne 0) { Die 'kohakumoss-config new data failed (its message is above)' }
} else {
    if ($Algo) { $Knobs += @('--str', "ALGO=$Algo") }
    if ($Source) { $Knobs += @('--source', $Source) }
    $rc = Invoke-Step ($WriteConfig + @('write', $RunConfig, '--weights', $Weights, '--data', $Dataset) + $Knobs)
}
if ($rc -ne 0) { Die "could not write $RunConfig" }
Test-Config $RunConfig 'train'

# the 6-12 GB layers train from the caches only (VAE_ENCODE / TEXT_ENCODE 'cache'): fill them without -Cache too
if (-not $Cache -and $ConfigTool.Count -gt 0) {
    $Probe = $WriteConfig + @('needs-cache', $RunConfig)
    $FromCache = & $Probe[0] $Probe[1..($Probe.Count - 1)] 2>$null
    if ($LASTEXITCODE -eq 0) {
        Say "this GPU layer trains from the caches only ($FromCache): filling them first, as -Cache does"
        $Cache = $true
    }
}
if ($Cache) {
    if ($ConfigTool.Count -gt 0) {
        foreach ($s in @('cache_text', 'cache_latents')) {
            if ((Invoke-Step ($Kogine + @('run', "scripts/data/$s.py", '--config', $DataConfig))) -ne 0) { Die "scripts/data/$s.py failed (its message is above)" }
        }
    } else {
        Say '-Cache needs the data config that kohakumoss-config writes; training encodes what is missing instead'
    }
}

$Sets = @()
if ($Resume) { $Sets += @('--set', 'RESUME=latest') }
if ($ConfigTool.Count -gt 0) { Say "data config for inspect_data / cache_text / cache_latents: $DataConfig" }
Say "training: runs/examples/train/$Name/ (log.txt, metrics.jsonl, samples/, checkpoints/, export/)"
exit (Invoke-Step ($Kogine + @('run', 'scripts/train/moss.py', '--config', $RunConfig) + $Sets))
