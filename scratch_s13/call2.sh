# session 13 call 2: the speed row with PDL on (and both baselines), then with PDL off, same machine
set -u
R=$OUT
date +%T
OUT=$R/s1 AREAS="" BENCH=train_step BENCH_TIMEOUT=330 ROW_TIMEOUT=300 TRAIN_ROWS="lora/speed/latent_text,baseline" \
  TRAIN_ARGS="--timing both --profile-steps 2" bash .ci/gpu 2>&1 | tail -25
date +%T
KOHAKUMOSS_PDL=0 OUT=$R/s0 AREAS="" BENCH=train_step BENCH_TIMEOUT=200 ROW_TIMEOUT=190 TRAIN_ROWS="lora/speed/latent_text" \
  TRAIN_ARGS="--timing both --profile-steps 2" bash .ci/gpu 2>&1 | tail -25
date +%T
