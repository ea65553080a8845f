"""Experiment: the cached 128-row decode tiles on 8 warps instead of 4.

Nsight Compute at EP8 B = 256 (run 25) has both GEMMs waiting with two warps per scheduler and under one eligible,
issue slots 42-49% busy: latency, not issue or bytes. 16x128x256 on 8 warps keeps each program's work and shared
memory (98304 B: 2 programs per SM either way) with twice the warps, each decoding half the rows (sm_90 AOT,
Triton 3.8: 151 registers a thread against 248; the same instructions per weight, no extra shared-memory traffic).
Run 21 found 8-warp tiles slower at B = 32-256, when every launch there walked the block loop; the op now takes a
program per possible block up to 8 pairs per expert. Times the op at real routing with the cached tiles, with
gemm1 16x128x256-w4-s3 everywhere (the control: the h200 cache's gemm1 pick from B = 4 up), and with gemm1 or
gemm2 16x128x256 on 8 warps.
Usage: python bench/exp/warps8.py OUT_DIR   (EXP_BATCHES, default 1,4,16,64,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings, tile_override

from sglang_glm5 import autotune

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,4,16,64,256").split(","))
SETTINGS = {
    "cache": {"pick_config": autotune.pick_config},
    "g1 16x128x256-w4-s3": {"pick_config": tile_override(gemm1="16x128x256-w4-s3")},  # the same tile on 4 warps
    "g1 16x128x256-w8-s3": {"pick_config": tile_override(gemm1="16x128x256-w8-s3")},
    "g2 16x128x256-w8-s3": {"pick_config": tile_override(gemm2="16x128x256-w8-s3")},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "warps8", autotune, SETTINGS, BATCHES, seed=41)
