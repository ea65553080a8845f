"""Experiment: the programs per SM under which gemm2 halves its N tiles per program (``MULTI_TILE_PROGRAMS_PER_SM``).

Where I is one or two K steps (GLM-5 TP8, I = 256) a gemm2 program walks up to 8 N tiles; the plan halves that while
the launch would have fewer than this many programs per SM. This times the op at real routing with the target at 2
(what the plan aimed for before), 3, 5 and 8, round-robin from CUDA graphs over the same routings, with each kernel's
time and whether the bits match; EP8 (I = 2048, one tile a program) is a control.
Usage: python bench/exp/multi_tile_plan.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,5,6,8,12,16; BENCH_SEED)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,5,6,8,12,16").split(","))
SETTINGS = {f"{n} per SM": {"MULTI_TILE_PROGRAMS_PER_SM": n} for n in (2, 3, 5, 8)}

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "multi_tile_plan", w4a16_plan, SETTINGS, BATCHES, seed=seed)
