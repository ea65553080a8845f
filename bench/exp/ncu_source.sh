#!/usr/bin/env bash
# Nsight Compute on the op's GEMMs at decode sizes, with the per-instruction (SASS) stall samples.
# Usage (on the GPU machine, from the laid-out package): bash bench/exp/ncu_source.sh OUT "ep8:2 ep8:64 tp8:2"
# For each layout:tokens: OUT/<layout>_b<tokens>_<kernel>.txt (details page) and .csv (SASS source page).
set -uo pipefail
out=$1; cases=${2:-"ep8:2"}
for case in $cases; do
  layout=${case%%:*}; tokens=${case##*:}
  for kernel in gemm1 gemm2; do
    name="$out/${layout}_b${tokens}_${kernel}"
    PROFILE_LAYOUT=$layout PROFILE_TOKENS=$tokens ncu --clock-control none --set full --import-source no \
      -k "regex:nvfp4_moe_${kernel}" -s 2 -c 1 -o "$name" -f python3 bench/profile_decode.py > "$name.log" 2>&1
    ncu -i "$name.ncu-rep" --page details > "$name.txt" 2>&1
    ncu -i "$name.ncu-rep" --page source --csv --print-source sass > "$name.csv" 2>&1
    grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Grid Size|Waves" "$name.txt" | head -12
    rm -f "$name.ncu-rep"
  done
done
