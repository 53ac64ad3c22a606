<#
.SYNOPSIS
KohakuMoss installer (Windows): makes .venv, installs torch from the index that fits this GPU and
driver, then KohakuMoss (editable, with its default extra and the dev tools), then runs the doctor.
.EXAMPLE
powershell -ExecutionPolicy Bypass -File scripts\install\install.ps1
.EXAMPLE
powershell -ExecutionPolicy Bypass -File scripts\install\install.ps1 -Index cu128 -NoDev
.NOTES
Options mirror install.sh: -Cpu, -Index cu126|cu128|cu130|xpu|cpu, -NoDev, -Python PY.
Environment: KOHAKUMOSS_TORCH_INDEX (as -Index), KOHAKUMOSS_PYTHON (as -Python).
Windows PowerShell 5.1 and PowerShell 7 both work.
#>
param(
    [switch]$Cpu,
    [ValidateSet('auto', 'cu126', 'cu128', 'cu130', 'xpu', 'cpu')][string]$Index = '',
    [switch]$NoDev,
    [string]$Python = ''
)
# Native tools write warnings to stderr; with 'Stop', Windows PowerShell 5.1 would turn those into
# terminating errors, so errors are checked by exit status ($LASTEXITCODE) instead.
$ErrorActionPreference = 'Continue'
Set-Location (Join-Path $PSScriptRoot '..\..')

function Say([string]$Text) { Write-Host "[install] $Text" }
function Die([string]$Text) {
    Write-Host "install.ps1: $Text" -ForegroundColor Red
    exit 1
}

$IndexChoice = 'auto'
if ($env:KOHAKUMOSS_TORCH_INDEX) { $IndexChoice = $env:KOHAKUMOSS_TORCH_INDEX }
if ($Index) { $IndexChoice = $Index }
if ($Cpu) { $IndexChoice = 'cpu' }
if (-not $Python -and $env:KOHAKUMOSS_PYTHON) { $Python = $env:KOHAKUMOSS_PYTHON }
if (@('auto', 'cu126', 'cu128', 'cu130', 'xpu', 'cpu') -notcontains $IndexChoice) {
    Die "KOHAKUMOSS_TORCH_INDEX '$IndexChoice' is not one of auto, cu126, cu128, cu130, xpu, cpu"
}

# --- Python: 3.12 where it exists, else the newest 3.10+ -------------------------------------
# A candidate is a command line (array); 'python' may be the Microsoft Store stub, which fails the probe.
function Test-Python([string[]]$Cmd) {
    $exe = $Cmd[0]
    $pre = @()
    if ($Cmd.Count -gt 1) { $pre = $Cmd[1..($Cmd.Count - 1)] }
    if (-not (Get-Command $exe -ErrorAction SilentlyContinue)) { return $false }
    try {
        & $exe @pre -c 'import sys; raise SystemExit(0 if sys.version_info >= (3, 10) else 1)' 2>$null | Out-Null
        return ($LASTEXITCODE -eq 0)
    } catch {
        return $false
    }
}
function Find-Python {
    foreach ($v in @('3.12', '3.13', '3.11', '3.10')) {
        if (Test-Python @('py', "-$v")) { return , @('py', "-$v") }
    }
    foreach ($c in @('python3', 'python')) {
        if (Test-Python @($c)) { return , @($c) }
    }
    return , @()
}
if ($Python) { $Py = @($Python -split '\s+') } else { $Py = Find-Python }
if ($Py.Count -eq 0) { Die 'no Python 3.10+ found; install Python 3.12 from python.org (it brings the py launcher) first' }
$PyExe = $Py[0]
$PyPre = @()
if ($Py.Count -gt 1) { $PyPre = $Py[1..($Py.Count - 1)] }
$PyVersion = (& $PyExe @PyPre --version 2>&1 | Out-String).Trim()
Say "python: $PyVersion ($($Py -join ' '))"

# --- GPU and driver -> PyTorch index -----------------------------------------------------------
function Get-TorchIndex {
    if (Get-Command nvidia-smi -ErrorAction SilentlyContinue) {
        & nvidia-smi -L 2>$null | Out-Null
        if ($LASTEXITCODE -eq 0) {
            $text = (& nvidia-smi 2>$null | Out-String)
            $m = [regex]::Match($text, 'CUDA Version:\s*(\d+)\.(\d+)')
            if (-not $m.Success) { return 'cu126' }
            $cuda = [int]($m.Groups[1].Value + $m.Groups[2].Value)
            if ($cuda -ge 130) { return 'cu130' }
            elseif ($cuda -ge 128) { return 'cu128' }
            elseif ($cuda -ge 126) { return 'cu126' }
            else { return "old-driver:$cuda" }
        }
    }
    try {
        $arc = @(Get-CimInstance -ClassName Win32_VideoController -ErrorAction Stop | Where-Object { $_.Name -match 'Intel.*Arc' })
        if ($arc.Count -gt 0) { return 'xpu' }
    } catch {
        Say 'could not list the video controllers (Get-CimInstance); assuming no Intel Arc GPU'
    }
    return 'cpu'
}
if ($IndexChoice -eq 'auto') { $IndexChoice = Get-TorchIndex }
if ($IndexChoice -like 'old-driver:*') {
    Say "the NVIDIA driver supports CUDA $($IndexChoice.Substring(11)) only; KohakuMoss needs a driver for CUDA 12.6+."
    Say 'update the driver, or rerun with -Cpu. Continuing with the default index.'
    $IndexChoice = 'default'
}
$Extras = @()
if (@('cu126', 'cu128', 'cu130') -contains $IndexChoice) { $Extras += 'cuda' }  # triton-windows, tilelang
elseif ($IndexChoice -eq 'xpu') { $Extras += 'xpu' }
if (-not $NoDev) { $Extras += 'dev' }
$Extra = $Extras -join ','
$Pkg = '.'
if ($Extra) { $Pkg = ".[$Extra]" }

$IndexUrl = ''
if ($IndexChoice -ne 'default') {
    $IndexUrl = "https://download.pytorch.org/whl/$IndexChoice"
    try {
        # Windows PowerShell 5.1 may default to TLS 1.0; the index needs 1.2.
        [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
        Invoke-WebRequest -Uri "$IndexUrl/" -UseBasicParsing -TimeoutSec 8 -ErrorAction Stop | Out-Null
    } catch {
        Say "the PyTorch index $IndexUrl cannot be reached; falling back to the default package index."
        $IndexUrl = ''
    }
}
$Shown = $IndexUrl
if (-not $Shown) { $Shown = 'default' }
Say "torch index: $Shown (choice: $IndexChoice), extras: [$Extra]"

# --- venv and packages -------------------------------------------------------------------------
$VPy = '.venv\Scripts\python.exe'
if (-not (Test-Path $VPy)) {
    & $PyExe @PyPre -m venv .venv
    if ($LASTEXITCODE -ne 0) { Die "could not make .venv with $($Py -join ' ')" }
}
& $VPy -m pip install -q --upgrade pip setuptools wheel 2>$null
if ($LASTEXITCODE -ne 0) { Say "could not upgrade pip (offline?); using the venv's own" }
$TorchSpec = @('torch>=2.13,<2.15', 'torchvision>=0.28,<0.30')
# newest versions the bounds allow, also into an existing .venv: a rerun gets what a fresh install gets
$Fresh = @('--upgrade', '--upgrade-strategy', 'eager')
if ($IndexUrl) { & $VPy -m pip install @Fresh @TorchSpec --index-url $IndexUrl } else { & $VPy -m pip install @Fresh @TorchSpec }
if ($LASTEXITCODE -ne 0) { Die 'installing torch failed (pip says why above)' }
# the torch build just installed stays (an eager upgrade could swap it for another index's build)
$KeepTorch = (& $VPy -c 'from importlib.metadata import version as v; print(''torch=='' + v(''torch''), ''torchvision=='' + v(''torchvision''))') -split ' '
if ($IndexUrl) { & $VPy -m pip install @Fresh -e $Pkg @KeepTorch --extra-index-url $IndexUrl } else { & $VPy -m pip install @Fresh -e $Pkg @KeepTorch }
if ($LASTEXITCODE -ne 0) { Die "installing KohakuMoss ($Pkg) failed (pip says why above)" }

Say 'installed; checking the environment'
& $VPy -c 'import kohakumoss.cli.doctor' 2>$null | Out-Null
if ($LASTEXITCODE -eq 0) {
    & $VPy -m kohakumoss.cli.doctor
    if ($LASTEXITCODE -ne 0) { Say 'the doctor reported problems above (training may still work on the CPU)' }
}
Say 'done. activate with: .venv\Scripts\Activate.ps1   (cmd: .venv\Scripts\activate.bat)'
Say 'if PowerShell refuses to run Activate.ps1: Set-ExecutionPolicy -Scope CurrentUser RemoteSigned (once per user)'
