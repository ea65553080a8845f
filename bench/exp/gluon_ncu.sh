#!/usr/bin/env bash
# Nsight Compute on the op's gemm1 and the Gluon gemm1 (bench/exp/gluon_gemm1.py) at one decode size.
# Usage (on the GPU machine, from the laid-out package): bash bench/exp/gluon_ncu.sh OUT [B]
set -uo pipefail
out=$1; batch=${2:-256}
name="$out/gluon_ncu_b$batch"
GLUON_PROFILE=1 EXP_BATCHES=$batch ncu --clock-control none --set full --import-source no -k "regex:gemm1" \
  -o "$name" -f python3 bench/exp/gluon_gemm1.py "$out" > "$name.log" 2>&1
ncu -i "$name.ncu-rep" --page details > "$name.txt" 2>&1
grep -E "gemm1|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Block Limit|Dynamic Shared|Stall|L2 Cache Throughput" "$name.txt" | head -120
rm -f "$name.ncu-rep"
