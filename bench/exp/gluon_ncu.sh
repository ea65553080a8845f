#!/usr/bin/env bash
# Nsight Compute on the op's gemm1 (16x64x256-w4-s3, launch 2) and the Gluon gemm1 (one quarter in flight, launch 3) of
# bench/exp/gluon_gemm1.py at one decode size: the details page and the SASS stall samples (ncu_hot.py) of each.
# Usage (on the GPU machine, from the laid-out package): bash bench/exp/gluon_ncu.sh OUT [B]
set -uo pipefail
out=$1; batch=${2:-256}
for launch in 2 3; do
  name="$out/gluon_ncu_b${batch}_l$launch"
  GLUON_PROFILE=1 EXP_BATCHES=$batch ncu --clock-control none --set full --import-source no -k "regex:gemm1" \
    -s $((launch - 1)) -c 1 -o "$name" -f python3 bench/exp/gluon_gemm1.py "$out" > "$name.log" 2>&1
  ncu -i "$name.ncu-rep" --page details > "$name.txt" 2>&1
  ncu -i "$name.ncu-rep" --page source --csv --print-source sass > "$name.csv" 2>&1
  echo "== launch $launch"
  grep -E "gemm1|Duration|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy" "$name.txt" | head -8
  python3 bench/exp/ncu_hot.py "$name.csv" 25
  rm -f "$name.ncu-rep"
done
tar -czf "$out/gluon_ncu.tgz" -C "$out" $(cd "$out" && ls gluon_ncu_b${batch}_l*.{txt,csv} 2>/dev/null) && \
  rm -f "$out"/gluon_ncu_b${batch}_l*.{txt,csv}
