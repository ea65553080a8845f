"""Experiment: the routing launch at a few pairs, sorted by expert (E + 1 programs) or a block per valid pair (one).

``w4a16_plan.EACH_PAIR_MAX_PAIRS`` (0: always sorted): up to that many pairs (T * k, at most E) the routing launch gives
each valid pair a block of its own in one program, without the histogram every one of the E + 1 sorting programs
builds (257 programs at GLM-5 TP8). Times the op at real routing, round-robin from CUDA graphs, with per-kernel
device times and a bit check (a pair's row is the same sums in either routing, so the outputs must be bit-identical).
Usage: python bench/exp/each_pair.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8").split(","))
SETTINGS = {
    "sorted": {"EACH_PAIR_MAX_PAIRS": 0},
    "each pair up to 16 pairs": {"EACH_PAIR_MAX_PAIRS": 16},
    "up to 64": {"EACH_PAIR_MAX_PAIRS": 64},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "each_pair", w4a16_plan, SETTINGS, BATCHES, seed=53)
