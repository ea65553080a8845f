#!/usr/bin/env bash
# Baseline vs patched on the same machine: start the stock server, load it, measure its accuracy, stop
# it; start the server with our MoE backend, load it, measure its accuracy against the baseline's, stop
# it; then compare (throughput gain beside the accuracy difference and KL). Results under
# $OUT/{baseline,patched}, the report under $OUT/compare_baseline_vs_patched/.
#
#   scripts/run_loadtest.sh /models/GLM-5-NVFP4 [extra `loadtest run` args, e.g. --input-len 2048]
#
# Each setting below can be overridden from the environment (CONCURRENCY=1,16 DURATION=30 ...).
set -euo pipefail

# The model folder: the first argument unless it is an option (every other argument is one), else MODEL.
if [[ $# -gt 0 && $1 != -* ]]; then
  MODEL=$1
  shift
fi
: "${MODEL:?usage: $0 MODEL_PATH [extra loadtest run args] (or MODEL=PATH $0 [extra loadtest run args])}"
PROFILE=${PROFILE:-}                                # `sglang-glm5 serve --profile` (empty: serve's default)
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-30000}
BASELINE_BACKEND=${BASELINE_BACKEND:-flashinfer_cutlass}  # the stock NVFP4 MoE path on SM120 (marlin on SM90)
PATCHED_BACKEND=${PATCHED_BACKEND:-nvfp4_triton}    # ours
CONCURRENCY=${CONCURRENCY:-1,8,32,64,128}
DURATION=${DURATION:-60}                            # seconds per run
REPEATS=${REPEATS:-3}
WARMUP=${WARMUP:-16}                                # warm-up requests before each sweep
SLO_TTFT_MS=${SLO_TTFT_MS:-2000}                    # goodput SLOs for the report
SLO_TPOT_MS=${SLO_TPOT_MS:-100}
OUT=${OUT:-loadtest_results}
SERVER_START_TIMEOUT=${SERVER_START_TIMEOUT:-1800}  # seconds to wait for /health (loading GLM-5 takes minutes)
ACCURACY=${ACCURACY:-1}                             # 0: throughput only
ACCURACY_ARGS=${ACCURACY_ARGS:-}                    # extra `loadtest accuracy` args, e.g. "--dataset gsm8k.jsonl"
ACCURACY_REFERENCE=${ACCURACY_REFERENCE:-}          # a results folder recorded once (e.g. a BF16 server's)

URL="http://${HOST}:${PORT}"
SERVER_PID=""
mkdir -p "$OUT"

stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "stopping server (process group $SERVER_PID)"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true     # SGLang's scheduler/TP workers too
        for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT

start_server() {  # $1 tag, $2 MoE runner backend
    local tag=$1 backend=$2
    local extra=(--moe-runner-backend "$backend")
    [[ -n "${SGLANG_GLM5_API_KEY:-}" ]] && extra+=(--api-key "$SGLANG_GLM5_API_KEY")
    local cmd=(sglang-glm5 serve --model "$MODEL" --host "$HOST" --port "$PORT")
    [[ -n "$PROFILE" ]] && cmd+=(--profile "$PROFILE")
    echo "starting $tag server: ${cmd[*]} -- --moe-runner-backend $backend"
    setsid "${cmd[@]}" -- "${extra[@]}" >"$OUT/$tag.server.log" 2>&1 &
    SERVER_PID=$!
    local t0=$SECONDS
    until curl -sf -o /dev/null "$URL/health"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "the $tag server exited during start; last lines of $OUT/$tag.server.log:" >&2
            tail -n 20 "$OUT/$tag.server.log" >&2
            exit 1
        fi
        if (( SECONDS - t0 > SERVER_START_TIMEOUT )); then
            echo "the $tag server did not answer $URL/health within ${SERVER_START_TIMEOUT}s" >&2
            exit 1
        fi
        sleep 5
    done
    echo "$tag server healthy after $((SECONDS - t0)) s"
}

LOAD_STATUS=0
load() {  # $1 tag, then extra `loadtest run` args
    local tag=$1 rc=0
    shift
    sglang-glm5 loadtest run --host "$URL" --tag "$tag" --out "$OUT" --concurrency "$CONCURRENCY" \
        --duration "$DURATION" --repeats "$REPEATS" --warmup "$WARMUP" --flush-cache --overwrite \
        --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" "$@" || rc=$?
    # 1: a run failed or none of its requests succeeded (recorded; the A/B goes on and compare reports what it
    # can); anything else (2: bad arguments) stops here
    (( rc == 0 || rc == 1 )) || exit "$rc"
    (( rc == 0 )) || LOAD_STATUS=1
}

ACCURACY_STATUS=0
accuracy() {  # $1 tag, $2 reference results folder (may be empty); after `load`, which replaces $OUT/$1
    local tag=$1 ref=$2
    [[ "$ACCURACY" == 1 ]] || return 0
    local cmd=(sglang-glm5 loadtest accuracy --host "$URL" --tag "$tag" --out "$OUT" --overwrite)
    [[ -n "$ref" ]] && cmd+=(--reference "$ref")
    # shellcheck disable=SC2206  # ACCURACY_ARGS is split into words on purpose
    cmd+=($ACCURACY_ARGS)
    "${cmd[@]}" || ACCURACY_STATUS=$?  # failed requests: counted, marked incomplete, reported by compare
}

start_server baseline "$BASELINE_BACKEND"
load baseline "$@"
accuracy baseline "$ACCURACY_REFERENCE"
stop_server

start_server patched "$PATCHED_BACKEND"
load patched "$@"
accuracy patched "${ACCURACY_REFERENCE:-$OUT/baseline}"
stop_server

sglang-glm5 loadtest compare "$OUT/baseline" "$OUT/patched" --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS"
exit $(( LOAD_STATUS > ACCURACY_STATUS ? LOAD_STATUS : ACCURACY_STATUS ))
