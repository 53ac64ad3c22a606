# session 13 call 1: GPU tests of the changed row kernels (PDL on), then the standalone table:
# d869fe9's code, this code with PDL off and on (twice, alternating)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
R=$OUT
PS="norm_modulate,norm_modulate_fork,norm_modulate_frozen,norm_modulate_fork_frozen,residual_norm_modulate,gated_residual"
ALL="$PS,swiglu,qk_norm_rope,rms_norm"
bench() {  # name dir ops env...
  local name=$1 dir=$2 ops=$3; shift 3
  mkdir -p "$R/$name"
  (cd "$dir" && env "$@" OUT="$R/$name" KOHAKUMOSS_CACHE="$R/cache-$name" PYTHONPATH="/tmp/site:$PWD/src" timeout 170 \
    python3 -c "import sys; from kohakuengine.cli import main; sys.exit(main())" run scripts/bench/kernels.py --strict \
    --set "OPS=$ops" --set BACKENDS=triton --set LORA=False --set BLOCK=False >"$R/$name/log" 2>&1)
  echo "$name rc $? $(date +%T)"
}
export PYTHONPATH=/tmp/site:$PWD/src
date +%T
KOHAKUMOSS_TRITON_PICK=0 timeout 230 python3 -m pytest -q -m gpu tests/kernels -k "not attention and not lora and not tilelang" -p no:cacheprovider >"$R/test_kernels.log" 2>&1
echo "kernels tests: $(tail -1 "$R/test_kernels.log") $(date +%T)"
KOHAKUMOSS_TRITON_PICK=0 timeout 100 python3 -m pytest -q -m gpu tests/trainer -k "graph" -p no:cacheprovider >"$R/test_trainer.log" 2>&1
echo "trainer tests: $(tail -1 "$R/test_trainer.log") $(date +%T)"
bench a_old scratch_s13/old "$PS"
bench b_pdl0 . "$ALL" KOHAKUMOSS_PDL=0
bench c_pdl1 . "$ALL" KOHAKUMOSS_PDL=1
bench d_pdl0 . "$ALL" KOHAKUMOSS_PDL=0
bench e_pdl1 . "$ALL" KOHAKUMOSS_PDL=1
grep -h "FAILED\|Error" "$R/test_kernels.log" | head -20
python3 scratch_s13/summarize.py "$R"
