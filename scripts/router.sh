#!/usr/bin/env bash
# SGLang's router (smg, cache-aware) in front of SGLang servers: a thin wrapper over `sglang-glm5 router`.
#
#   scripts/router.sh http://10.0.0.1:30000 http://10.0.0.2:30000          # router on 127.0.0.1:8000
#   HOST=0.0.0.0 PORT=8000 scripts/router.sh http://10.0.0.1:30000 http://10.0.0.2:30000 -- --log-level warn
#   scripts/router.sh http://10.0.0.1:30000 http://10.0.0.2:30000 --dry-run   # print the router's command only
#
# The worker URLs come first; every other argument goes to `sglang-glm5 router` as is (--dry-run, --api-key K,
# -- extra smg args); `sglang-glm5 router --help` lists them.
#
# Each worker is a replica started with scripts/launch_server.sh (or `sglang-glm5 serve`) on its own machine,
# with HOST=0.0.0.0 so that the router can reach it. Then: sglang-glm5 loadtest run --host http://127.0.0.1:8000
set -euo pipefail

HOST=${HOST:-127.0.0.1}              # 0.0.0.0 exposes the router to the network
PORT=${PORT:-8000}
METRICS_PORT=${METRICS_PORT:-29000}  # Prometheus metrics, on HOST too
POLICY=${POLICY:-cache_aware}

workers=()
while [[ $# -gt 0 && "$1" != -* ]]; do
    workers+=("$1")
    shift
done
[[ ${#workers[@]} -gt 0 ]] || { echo "usage: $0 WORKER_URL [WORKER_URL ...] [--dry-run] [-- extra smg args]" >&2; exit 2; }
exec sglang-glm5 router --host "$HOST" --port "$PORT" --metrics-port "$METRICS_PORT" --policy "$POLICY" \
    --worker-urls "${workers[@]}" "$@"
