#!/usr/bin/env bash
# One call on the lent GPU machine: real compilation, the tests on the GPU, the self-check on the
# GLM-5 EP8 layer, and the kernel benchmark. Results land in $OUT (or ./device_out).
# The machine has no package registry: the package is laid out by copying, pytest comes as wheels (.whl).
#
#   bash bench/device_run.sh [STEPS]     # STEPS: comma-separated step names (or the STEPS variable)
#
# Steps: tests, selfcheck, bench, sweep, exp, tune, base, bits, profile (below); the Marlin peer and Triton 3.8:
#   marlin       build vLLM's Marlin MoE (bench/peers/build_marlin.py, from $VLLM_SRC, default .peers/vllm-marlin:
#                `build_marlin.py --vllm <vLLM tree> --export .peers/vllm-marlin`) into /tmp/marlin_build (built
#                once per call; if the build fails, .peers/prebuilt/glm5_marlin_peer.so where carried), then
#                Marlin and the op against the float64 reference at EP8, 1, 37, 256 tokens
#   peers        `bench --peers marlin` (real routing, EP8 and TP8, B = PEERS_BATCH) under the image's Triton
#   t38          unpack Triton 3.8 (.peers/triton38.tar.xz, stripped; bench/README says how) into /tmp/t38
#   tests38, selfcheck38, peers38    tests / selfcheck / peers with /tmp/t38 first on PYTHONPATH, its own
#                TRITON_CACHE_DIR and SGLANG_GLM5_CACHE_DIR
# Each step prints its seconds. More than 8 files in $OUT at the end are packed into device_out.tar.gz (the
# device tool brings back 8 files), the Marlin tables (*marlin*.md) and env files kept beside it.
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
STEPS=${1:-${STEPS:-tests,selfcheck,bench}}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
T0=$SECONDS; LAST=$SECONDS
mark() { echo "== step $1: $((SECONDS - LAST)) s (call so far $((SECONDS - T0)) s)"; LAST=$SECONDS; }
VLLM_SRC=${VLLM_SRC:-$REPO/.peers/vllm-marlin}
MARLIN_BUILD=${MARLIN_BUILD:-/tmp/marlin_build}
MARLIN_LIB=$MARLIN_BUILD/glm5_marlin_peer.so
T38=${T38:-/tmp/t38}
GPU_NAME=$(python3 -c "from sglang_glm5.hardware import detect; print(detect(0).name)" 2>/dev/null || echo gpu)
MARLIN_PREBUILT=${MARLIN_PREBUILT:-$REPO/.peers/prebuilt/glm5_marlin_peer.so}
marlin_build() {  # once per call; where the build fails, a library built elsewhere (MARLIN_PREBUILT) if carried
  [[ -f $MARLIN_LIB ]] && return 0
  python3 bench/peers/build_marlin.py --vllm "$VLLM_SRC" --build-dir "$MARLIN_BUILD" 2>&1 | tee "$OUT/marlin_build.log" \
    | tail -3 && return 0
  [[ -f $MARLIN_PREBUILT ]] || return 1
  echo "marlin: the build failed (marlin_build.log); using $MARLIN_PREBUILT" | tee -a "$OUT/marlin_build.log"
  mkdir -p "$MARLIN_BUILD" && cp "$MARLIN_PREBUILT" "$MARLIN_LIB"
}
run38() {  # a command under Triton 3.8 (the unpacked wheel shadows the image's Triton)
  PYTHONPATH="$T38${PYTHONPATH:+:$PYTHONPATH}" TRITON_CACHE_DIR=/tmp/triton_cache38 \
    SGLANG_GLM5_CACHE_DIR=/tmp/sglang_glm5_cache38 "$@"
}
peers_bench() {  # $1: name suffix; the rest: a prefix command (run38) or nothing
  local tag=$1; shift
  "$@" "${LIMIT[@]}" python3 -m sglang_glm5.cli bench --peers marlin --marlin-lib "$MARLIN_LIB" --skew 0 \
    --batch "${PEERS_BATCH:-1,2,4,8,16,32,64,128,256,2048,8192}" --shape ${PEERS_SHAPES:-glm5-ep8 glm5-tp8} \
    --seed "${BENCH_SEED:-1}" --out "$OUT" --name "${GPU_NAME}_marlin_$tag" ${PEERS_ARGS:-} 2>&1 \
    | tee "$OUT/marlin_$tag.log"
}
# STEP_LIMIT_S: seconds each test, experiment and bench command may run (coreutils timeout), so that one slow step does
# not take a device call's whole time limit from the steps after it; unset: no limit.
LIMIT=(); [[ -n ${STEP_LIMIT_S:-} ]] && LIMIT=(timeout "$STEP_LIMIT_S")
rc=0
if has marlin; then
  marlin_build || rc=1
  mark marlin_build
  python3 - "$MARLIN_LIB" "${BENCH_SEED:-1}" <<'PY' 2>&1 | tee "$OUT/marlin_numerics.log" || rc=1
import sys
from sglang_glm5 import bench_real, peers
peers.load_marlin(sys.argv[1])
print("Marlin and ours against the float64 reference, EP8, real routing (-1 ids)\n" + bench_real.NUMERICS_HEADER)
cases = bench_real.check_marlin(bench_real.LAYOUTS["ep8"], (1, 37, 256), seed=int(sys.argv[2]))
sys.exit(0 if all(c["ok"] for c in cases) else 1)
PY
  mark marlin_numerics
fi
GPU_TESTS=(tests/test_moe.py tests/test_split_k.py tests/test_nvfp4.py tests/test_prefill.py tests/test_weight_layout.py
  tests/test_gluon.py tests/test_ready_blocks.py tests/test_two_chains.py tests/test_peers.py)
if has tests; then
  MARLIN_PEER_LIB=$MARLIN_LIB SGLANG_GLM5_TEST_DEVICE=cuda "${LIMIT[@]}" python3 -m pytest -q -rs \
    -p no:cacheprovider "${GPU_TESTS[@]}" 2>&1 | tee "$OUT/pytest_cuda.log" | tail -15 || rc=1
  mark tests
fi
if has selfcheck; then
  python3 -m sglang_glm5.cli selfcheck --tokens 1,7,64,512 2>&1 | tee "$OUT/selfcheck.log" || rc=1
  mark selfcheck
fi
if has peers; then
  marlin_build && peers_bench t36 || rc=1
  mark peers
fi
if has t38 || has tests38 || has selfcheck38 || has peers38; then
  if [[ ! -d $T38/triton ]]; then
    mkdir -p "$T38" && tar xJf "$REPO/.peers/triton38.tar.xz" -C "$T38" || rc=1
  fi
  run38 python3 -c "import triton, torch; print('triton', triton.__version__, triton.__file__, 'torch', torch.__version__)" \
    2>&1 | tee "$OUT/env38.txt" || rc=1
  mark t38
fi
if has tests38; then
  run38 env MARLIN_PEER_LIB="$MARLIN_LIB" SGLANG_GLM5_TEST_DEVICE=cuda "${LIMIT[@]}" python3 -m pytest -q -rs \
    -p no:cacheprovider "${GPU_TESTS[@]}" 2>&1 | tee "$OUT/pytest_cuda38.log" | tail -15 || rc=1
  mark tests38
fi
if has selfcheck38; then
  run38 python3 -m sglang_glm5.cli selfcheck --device cuda --tokens 1,7,64,512 2>&1 | tee "$OUT/selfcheck38.log" || rc=1
  mark selfcheck38
fi
if has peers38; then
  marlin_build && peers_bench t38 run38 || rc=1
  mark peers38
fi
if has sweep; then
  python3 bench/sweep_configs.py --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" || rc=1
fi
if has exp; then
  # One-off experiment scripts, each given $OUT: EXP=bench/exp/NAME.py (log exp.log), or several, comma-separated, in
  # that order (logs exp_NAME.log).
  IFS=, read -ra scripts <<< "${EXP:?EXP=path of the experiment script}"
  for script in "${scripts[@]}"; do
    log=exp.log; (( ${#scripts[@]} > 1 )) && log="exp_$(basename "$script" .py).log"
    "${LIMIT[@]}" python3 "$script" "$OUT" 2>&1 | tee "$OUT/$log" || rc=1
  done
fi
if has tune; then
  # Measured configs for this GPU into the user cache (which the op then reads), copied to $OUT. TUNE_BATCHES: tokens
  # per expert (tune's --batch-sizes; GLM-5 B = 8192 is 256 at EP8 and TP8), TUNE_ARGS: more tune arguments
  # (--splits-only).
  python3 -m sglang_glm5.cli tune --target local --shape ${TUNE_SHAPES:-glm5-ep8} \
    --batch-sizes "${TUNE_BATCHES:-1,16,64,2048}" ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" || rc=1
  cp "${SGLANG_GLM5_CACHE_DIR:-$HOME/.cache/sglang_glm5}"/autotune/*.json "$OUT/" 2>/dev/null
fi
if has bench; then
  # Decode at real routing (the default), then the balanced-m table; named after the GPU (h200_moe_bench, ...) unless
  # BENCH_NAME says otherwise.
  BENCH_NAME=${BENCH_NAME:-$(python3 -c "from sglang_glm5.hardware import detect; print(detect(0).name)")_moe_bench}
  "${LIMIT[@]}" python3 -m sglang_glm5.cli bench --out "$OUT" --name "${BENCH_NAME}_real" --seed "${BENCH_SEED:-1}" \
    ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench_real.log" || rc=1
  "${LIMIT[@]}" python3 -m sglang_glm5.cli bench --routing balanced --m "${BENCH_M:-1,4,16,32,64,128,2048}" --out "$OUT" \
    --name "$BENCH_NAME" 2>&1 | tee "$OUT/bench.log" || rc=1
  mark bench
fi
if has base && [[ -d "$REPO/.base" ]]; then
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
  mark base
fi
if has bits && [[ -d "$REPO/.base" ]]; then
  # The op's output bits on GLM-5's full layers, the revision in .base/ and then this one (bench/gpu_bits.py)
  BASE=/tmp/pkg_base; [[ -d $BASE ]] || cp -r "$REPO/.base" "$BASE"
  [ -f "$BASE/sglang_glm5/bench_real.py" ] || cp "$PKG/sglang_glm5/bench_real.py" "$BASE/sglang_glm5/"
  SGLANG_GLM5_CACHE_DIR=/tmp/cache_base PYTHONPATH=$BASE python3 -P bench/gpu_bits.py "$OUT/bits_base.json" \
    2>&1 | tail -5 || rc=1
  python3 -P bench/gpu_bits.py "$OUT/bits_head.json" --against "$OUT/bits_base.json" 2>&1 | tee "$OUT/bits.log" || rc=1
  mark bits
fi
if has profile; then
  # Hardware counters of the two GEMMs at decode size (Firecracker machines; clocks left alone).
  ncu --clock-control none ${NCU_SECTIONS:---set full} -k regex:nvfp4_moe_gemm -c 2 python3 bench/profile_decode.py \
    > "$OUT/ncu_decode.txt" 2>&1 || rc=1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Executed Ipc|Issue Slots Busy|Compute \(SM\) Throughput|Mem Busy|Max Bandwidth|Waves Per SM|Shared Memory Configuration Size|Dynamic Shared" \
    "$OUT/ncu_decode.txt" | head -80
fi
n_out=$(find "$OUT" -type f | wc -l)
if (( n_out > 8 )); then
  tar czf /tmp/device_out.tar.gz -C "$OUT" . && mkdir -p /tmp/keep && rm -rf /tmp/keep/* \
    && find "$OUT" -maxdepth 1 -type f \( -name '*marlin*.md' -o -name 'env*.txt' \) -exec cp {} /tmp/keep/ \; \
    && find "$OUT" -mindepth 1 -delete && mv /tmp/device_out.tar.gz "$OUT/" \
    && ls /tmp/keep | head -7 | while read -r f; do cp "/tmp/keep/$f" "$OUT/"; done
  echo "device_run: $n_out files packed into device_out.tar.gz"
fi
echo "device_run: steps $STEPS, $((SECONDS - T0)) s, rc $rc"
exit $rc
