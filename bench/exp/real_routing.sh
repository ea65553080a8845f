#!/usr/bin/env bash
# Decode at real routing (sglang_glm5/bench_real.py), this revision against a baseline revision laid out
# in .base/ (an installed-style copy of the package, e.g. from `git archive`), in one session on one GPU.
# Then the same bench with other PROGRAMS_PER_SM values and a few explicit tiles (EXTRA=1).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=$(realpath -m "${OUT:-device_out}"); mkdir -p "$OUT"
NEW=/tmp/pkg_new; rm -rf "$NEW"; mkdir -p "$NEW"
cp -r sglang_glm5 "$NEW/"; for sub in kernels patches loadtest configs; do cp -r "$sub" "$NEW/sglang_glm5/$sub"; done
BASE=/tmp/pkg_base; rm -rf "$BASE"; cp -r .base "$BASE"; cp sglang_glm5/bench_real.py "$BASE/sglang_glm5/"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
ARGS=${ARGS:-}
cd /tmp
echo "== this revision"; PYTHONPATH=$NEW timeout 280 python3 -m sglang_glm5.bench_real --json "$OUT/real_new.json" $ARGS 2>&1 | tee "$OUT/real_new.log"
echo "== baseline"; PYTHONPATH=$BASE timeout 200 python3 -m sglang_glm5.bench_real --json "$OUT/real_base.json" --no-baselines $ARGS 2>&1 | tee "$OUT/real_base.log"
if [[ -n ${EXTRA:-} ]]; then
  for pps in 1 4; do
    echo "== PROGRAMS_PER_SM=$pps"
    PYTHONPATH=$NEW timeout 60 python3 -c "
import sys, sglang_glm5.moe as m; m.PROGRAMS_PER_SM = $pps
from sglang_glm5 import bench_real as b; sys.exit(b.main(['--batch', '1,4,16', '--no-baselines']))" 2>&1 | tee -a "$OUT/extra.log"
  done
fi
