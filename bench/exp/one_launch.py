"""Experiment: the op in one launch (``variants.w4a16_decode``) against its four launches at GLM-5 B = 1-4.

One grid of persistent programs ranks the valid pairs itself, runs gemm1's (pair, N tile, K split) units, then
gemm2's, each waiting for its pair's h, and the last of a token's units adds the top-k sum: no routing launch, no sum
launch, gemm2's programs start without waiting for the whole of gemm1. Times the op at real routing, round-robin from
CUDA graphs, with per-kernel device times and the largest relative difference to the four launches (other K splits:
not the same bits). First prints the kernel's registers and shared memory at GLM-5 EP8 (whether the planned programs
fit on the GPU at once).
Measured (run 41, bench/README.md): slower than the four launches at every B = 1-4 of both layouts, 1.20-1.23x (EP8)
and 1.41-1.52x (TP8) in its best form; the path was removed after it. Runs at commit 8536fd3, which has the path
(``variants.w4a16_decode``, off by default).
Usage: python bench/exp/one_launch.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4; BENCH_SEED)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_decode

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4").split(","))
# the variants' common settings (calls 2-3 of run 41 ran before compare_settings reset every attribute each variant)
BASE = {
    "MAX_PAIRS": 32,
    "TILE1": (128, 256),
    "TILE2": (64, 256),
    "NUM_STAGES": 2,
    "PROGRAMS_PER_SM": 2,
    "PHASES": 3,
    "TWO_LAUNCHES": False,
}
SETTINGS = {
    "four launches": {**BASE, "MAX_PAIRS": 0},
    "one launch 128x256 s2": BASE,
    "s3": {**BASE, "NUM_STAGES": 3},
    "gemm1 64x256": {**BASE, "TILE1": (64, 256)},
    "gemm2 128x256": {**BASE, "TILE2": (128, 256)},
    "1 a SM": {**BASE, "PROGRAMS_PER_SM": 1},
    "gemm1 alone": {**BASE, "PHASES": 1},
    "two launches": {**BASE, "TWO_LAUNCHES": True},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "one_launch", w4a16_decode, SETTINGS, BATCHES, seed=43)
