# session 13 call 3: memory / model GPU tests at this code (per-sample ops under checkpointing), then the
# attention rows and the block (eager, compile, registry) with this session's kernels
set -u
R=$OUT
date +%T
OUT=$R/t AREAS="memory model" AREA_TIMEOUT=150 bash .ci/gpu 2>&1 | grep "tests/"
date +%T
OUT=$R/k AREAS="" BENCH=kernels BENCH_TIMEOUT=330 \
  KERNELS_SET="OPS=varlen_attention ATTN_BACKENDS=triton,sdpa_groups BACKENDS=triton LORA=False BLOCK=True" \
  bash .ci/gpu >/dev/null 2>&1
tar xzf $R/k/gpu-run.tar.gz -C $R/k kernels.log && sed -n '/^NVIDIA/,$p' $R/k/kernels.log | grep -v "^  \|Triton launch" | head -40
date +%T
