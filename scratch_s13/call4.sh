# session 13 call 4: every kernels GPU test at the final code (PDL on), then the final standalone table
set -u
R=$OUT
date +%T
OUT=$R/t AREAS="kernels" AREA_TIMEOUT=170 bash .ci/gpu 2>&1 | grep "tests/"
tar xzf $R/t/gpu-run.tar.gz -C $R/t test_kernels.log && grep -E "^FAILED|^ERROR" $R/t/test_kernels.log | head
date +%T
OUT=$R/k AREAS="" BENCH=kernels BENCH_TIMEOUT=300 \
  KERNELS_SET="OPS=rms_norm,qk_norm_rope,norm_modulate,norm_modulate_fork,norm_modulate_frozen,norm_modulate_fork_frozen,residual_norm_modulate,gated_residual,swiglu,apply_rope BACKENDS=triton LORA=False BLOCK=False" \
  bash .ci/gpu >/dev/null 2>&1
tar xzf $R/k/gpu-run.tar.gz -C $R/k kernels.log kernels_bench.json && mkdir -p $R/sum/final && cp $R/k/kernels_bench.json $R/sum/final/ && python3 scratch_s13/summarize.py $R/sum
date +%T
