"""Experiment: gemm2's 128-row N tiles as two halves of 64 rows, one after the other.

gemm2 decodes a whole [BLOCK_N, BLOCK_K] weight tile before its dots, so 16x128x256-w4-s3 (the h200 cache's EP8
pick from 4 to 8 tokens per expert) holds 128 rows of decoded weights in registers: 228 a thread (sm_90 AOT, Triton
3.8), 2 programs of 4 warps per SM. As two halves (``w4a16_plan.GEMM2_HALVES``, ``HALVES`` in the kernel: two
accumulators, each half decoded and multiplied in turn, the activations loaded once) it takes 147, and its 61440 B
of shared memory let 3 programs in; gemm1 already works that way (gate, then up). Nsight Compute at EP8 B = 256
(run 25): gemm2 1.88 warps per scheduler, 0.64 eligible, issue slots 42% busy. With the block loop the halves take
188 (2 per SM), so the third variant also takes the whole grid up to 8 pairs per expert
(``WHOLE_GRID_PAIRS_PER_EXPERT``). Times the op at real routing (the first variant is the op of bfa1e13) with
per-kernel device times and a bit check. The logged run (``h200/runs/run25_gemm2_halves.log``) set the same grids
through an earlier form of the switch (a whole-grid bound for busy experts), before the op took these defaults.
Usage: python bench/exp/gemm2_halves.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
# Written when the op's defaults were one tile and the whole grid below one pair per expert (bfa1e13).
ONE_TILE = {"GEMM2_HALVES": False, "WHOLE_GRID_PAIRS_PER_EXPERT": 0.99}
WHOLE = {"WHOLE_GRID_PAIRS_PER_EXPERT": 8}
SETTINGS = {
    "one tile": ONE_TILE,
    "halves": {**ONE_TILE, "GEMM2_HALVES": True},
    "halves, whole grid": {**ONE_TILE, "GEMM2_HALVES": True, **WHOLE},
    "one tile, whole grid": {**ONE_TILE, **WHOLE},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "gemm2_halves", w4a16_plan, SETTINGS, BATCHES, seed=41)
