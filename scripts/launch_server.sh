#!/usr/bin/env bash
# Start SGLang serving GLM-5-NVFP4 with a launch profile: a thin wrapper over `sglang-glm5 serve`.
#
#   scripts/launch_server.sh /models/GLM-5-NVFP4                 # default profile, 127.0.0.1:30000
#   scripts/launch_server.sh /models/GLM-5-NVFP4 --dry-run       # print the plan and the SGLang command only
#   scripts/launch_server.sh /models/GLM-5-NVFP4 -- --moe-runner-backend flashinfer_cutlass   # stock MoE baseline
#
# Two nodes (profile rtx-pro-6000x16-ep16): run on each node, with the same DIST_INIT_ADDR (node 0's address):
#   PROFILE=rtx-pro-6000x16-ep16 NODE_RANK=0 DIST_INIT_ADDR=10.0.0.1:50000 scripts/launch_server.sh /models/GLM-5-NVFP4
#   PROFILE=rtx-pro-6000x16-ep16 NODE_RANK=1 DIST_INIT_ADDR=10.0.0.1:50000 scripts/launch_server.sh /models/GLM-5-NVFP4
#
# Every other argument goes to `sglang-glm5 serve` as is (--dry-run, --context N, --api-key K, -- extra SGLang
# args); `sglang-glm5 serve --help` lists them. Settings from the environment:
set -euo pipefail

# The model folder: the first argument unless it is an option (every other argument is one), else MODEL.
if [[ $# -gt 0 && $1 != -* ]]; then
  MODEL=$1
  shift
fi
: "${MODEL:?usage: $0 MODEL_PATH [--dry-run] [serve options] [-- extra sglang args] (or MODEL=PATH $0 ...)}"
PROFILE=${PROFILE:-rtx-pro-6000x8-ep8}   # configs/profiles/*.toml; `sglang-glm5 plan --profile P` explains one
HOST=${HOST:-127.0.0.1}                  # 0.0.0.0 exposes the server: set SGLANG_GLM5_API_KEY too
PORT=${PORT:-30000}
NODE_RANK=${NODE_RANK:-}                 # two-node profile only: 0 on the node that serves HTTP, 1 on the other
DIST_INIT_ADDR=${DIST_INIT_ADDR:-}       # two-node profile only: node 0's HOST:PORT for the rendezvous
# SGLANG_GLM5_API_KEY, when set, becomes the server's --api-key (serve reads it).

cmd=(sglang-glm5 serve --model "$MODEL" --profile "$PROFILE" --host "$HOST" --port "$PORT")
[[ -n "$NODE_RANK" ]] && cmd+=(--node-rank "$NODE_RANK")
[[ -n "$DIST_INIT_ADDR" ]] && cmd+=(--dist-init-addr "$DIST_INIT_ADDR")
exec "${cmd[@]}" "$@"
