#!/usr/bin/env bash
# One device call: the op's host time at this revision against the one laid out in .base/ (git archive of sglang_glm5
# kernels patches loadtest configs, moved as they install), alternating the two trees in separate processes, PASSES
# times each (host times on these machines move by tens of percent between processes: compare within one call).
# Each pass runs bench/exp/host_split.py (EXP_SETTINGS=shipped) and bench/exp/eager_host.py (EXP_BATCHES, default
# 1,8,64), this revision's scripts on either tree. Everything lands in $OUT/host_ab.tar.gz (one file back).
# Usage, from the repository root on the device: bash bench/exp/host_ab.sh
set -uo pipefail
OUT=$(realpath -m "${OUT:-device_out}"); mkdir -p "$OUT"
STEPS=none bash bench/device_run.sh >/dev/null
BASE=/tmp/pkg_base; rm -rf "$BASE"; cp -r .base "$BASE"
RES=/tmp/host_ab; rm -rf "$RES"; mkdir -p "$RES"; cp "$OUT/env.txt" "$RES/"
cd /tmp/pkg/bench/exp || exit 1
rc=0
for pass in $(seq "${PASSES:-2}"); do
  for tree in base new; do
    root=/tmp/pkg; [[ $tree == base ]] && root=$BASE
    dir=$RES/${tree}${pass}; mkdir -p "$dir"
    EXP_SETTINGS=shipped PYTHONPATH=$root python3 host_split.py "$dir" > "$dir/host_split.log" 2>&1 || rc=1
    EXP_BATCHES=${EXP_BATCHES:-1,8,64} PYTHONPATH=$root python3 eager_host.py "$dir" > "$dir/eager_host.log" 2>&1 || rc=1
    echo "== $tree pass $pass"; grep -h "wall\|eager" "$dir"/*.log | cut -c1-150
  done
done
tar -czf "$OUT/host_ab.tar.gz" -C "$RES" .
exit $rc
