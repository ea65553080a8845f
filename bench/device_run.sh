#!/usr/bin/env bash
# One call on the lent GPU machine: real compilation, the tests on the GPU, the self-check on the
# GLM-5 EP8 layer, and the kernel benchmark. Results land in $OUT (or ./device_out).
# The machine has no package registry: the package is laid out by copying, pytest comes as wheels (.whl).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=$(realpath -m "${OUT:-device_out}"); mkdir -p "$OUT"
# Lay the package out as it installs (kernels/ -> sglang_glm5/kernels, ...) and run from there, so that
# the repository's own sglang_glm5/ folder does not shadow it.
REPO=$(pwd)
PKG=/tmp/pkg; rm -rf "$PKG"; mkdir -p "$PKG"
cp -r sglang_glm5 tests bench "$PKG/"
for sub in kernels patches loadtest configs; do cp -r "$sub" "$PKG/sglang_glm5/$sub"; done
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import pytest" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
cd "$PKG"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
STEPS=${STEPS:-tests,selfcheck,bench}
# STEP_LIMIT_S: seconds each test, experiment and bench command may run (coreutils timeout), so that one slow step does
# not take a device call's whole time limit from the steps after it; unset: no limit.
LIMIT=(); [[ -n ${STEP_LIMIT_S:-} ]] && LIMIT=(timeout "$STEP_LIMIT_S")
rc=0
if [[ $STEPS == *tests* ]]; then
  SGLANG_GLM5_TEST_DEVICE=cuda "${LIMIT[@]}" python3 -m pytest -q -rs -p no:cacheprovider tests/test_moe.py tests/test_split_k.py \
    tests/test_nvfp4.py tests/test_prefill.py tests/test_weight_layout.py tests/test_gluon.py \
    tests/test_ready_blocks.py tests/test_two_chains.py 2>&1 \
    | tee "$OUT/pytest_cuda.log" | tail -15 || rc=1
fi
if [[ $STEPS == *selfcheck* ]]; then
  python3 -m sglang_glm5.cli selfcheck --tokens 1,7,64,512 2>&1 | tee "$OUT/selfcheck.log" || rc=1
fi
if [[ $STEPS == *sweep* ]]; then
  python3 bench/sweep_configs.py --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" || rc=1
fi
if [[ $STEPS == *exp* ]]; then
  # One-off experiment scripts, each given $OUT: EXP=bench/exp/NAME.py (log exp.log), or several, comma-separated, in
  # that order (logs exp_NAME.log).
  IFS=, read -ra scripts <<< "${EXP:?EXP=path of the experiment script}"
  for script in "${scripts[@]}"; do
    log=exp.log; (( ${#scripts[@]} > 1 )) && log="exp_$(basename "$script" .py).log"
    "${LIMIT[@]}" python3 "$script" "$OUT" 2>&1 | tee "$OUT/$log" || rc=1
  done
fi
if [[ $STEPS == *tune* ]]; then
  # Measured configs for this GPU into the user cache (which the op then reads), copied to $OUT. TUNE_BATCHES: tokens
  # per expert (tune's --batch-sizes; GLM-5 B = 8192 is 256 at EP8 and TP8), TUNE_ARGS: more tune arguments
  # (--splits-only).
  python3 -m sglang_glm5.cli tune --target local --shape ${TUNE_SHAPES:-glm5-ep8} \
    --batch-sizes "${TUNE_BATCHES:-1,16,64,2048}" ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" || rc=1
  cp "${SGLANG_GLM5_CACHE_DIR:-$HOME/.cache/sglang_glm5}"/autotune/*.json "$OUT/" 2>/dev/null
fi
if [[ $STEPS == *bench* ]]; then
  # Decode at real routing (the default), then the balanced-m table; named after the GPU (h200_moe_bench, ...) unless
  # BENCH_NAME says otherwise.
  BENCH_NAME=${BENCH_NAME:-$(python3 -c "from sglang_glm5.hardware import detect; print(detect(0).name)")_moe_bench}
  "${LIMIT[@]}" python3 -m sglang_glm5.cli bench --out "$OUT" --name "${BENCH_NAME}_real" --seed "${BENCH_SEED:-1}" \
    ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench_real.log" || rc=1
  "${LIMIT[@]}" python3 -m sglang_glm5.cli bench --routing balanced --m "${BENCH_M:-1,4,16,32,64,128,2048}" --out "$OUT" \
    --name "$BENCH_NAME" 2>&1 | tee "$OUT/bench.log" || rc=1
fi
if [[ $STEPS == *base* && -d "$REPO/.base" ]]; then
  # The same benches (the same routings: BENCH_SEED; BASE_ARGS: more bench_real arguments, e.g. --batch 5,9), our op
  # only, on an earlier revision laid out in .base/ (git archive of
  # sglang_glm5 kernels patches loadtest configs, moved as they install), with its own empty cache; a revision older
  # than bench_real.py gets this one's.
  BASE=/tmp/pkg_base; rm -rf "$BASE"; cp -r "$REPO/.base" "$BASE"; [ -f "$BASE/sglang_glm5/bench_real.py" ] || cp "$PKG/sglang_glm5/bench_real.py" "$BASE/sglang_glm5/"
  # -P: the current directory ($PKG, which holds this revision's sglang_glm5/) stays off sys.path.
  SGLANG_GLM5_CACHE_DIR=/tmp/cache_base PYTHONPATH=$BASE python3 -P -m sglang_glm5.bench_real --no-baselines \
    --skew ${BASE_SKEW:-0} --seed "${BENCH_SEED:-1}" ${BASE_ARGS:-} --json "$OUT/base_real.json" 2>&1 | tee "$OUT/base_real.log" || rc=1
  SGLANG_GLM5_CACHE_DIR=/tmp/cache_base PYTHONPATH=$BASE python3 -P -m sglang_glm5.cli bench --routing balanced \
    --no-baselines --m "${BENCH_M:-1,4,16,32,64,128,2048}" --out "$OUT" --name base_balanced 2>&1 | tee "$OUT/base_balanced.log" || rc=1
fi
if [[ $STEPS == *profile* ]]; then
  # Hardware counters of the two GEMMs at decode size (Firecracker machines; clocks left alone).
  ncu --clock-control none ${NCU_SECTIONS:---set full} -k regex:nvfp4_moe_gemm -c 2 python3 bench/profile_decode.py \
    > "$OUT/ncu_decode.txt" 2>&1 || rc=1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Executed Ipc|Issue Slots Busy|Compute \(SM\) Throughput|Mem Busy|Max Bandwidth|Waves Per SM|Shared Memory Configuration Size|Dynamic Shared" \
    "$OUT/ncu_decode.txt" | head -80
fi
exit $rc
