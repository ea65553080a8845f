"""Experiment: the routing launch at a few pairs, by its E + 1 sorting programs or by one (``routing.FEW_ROUTE_PAIRS``).

Runs at commit f2a30a9, which has the switch (slower than the block-per-pair routing: bench/README.md run 27; reverted
after it).

Each of the E + 1 programs (257 at GLM-5 TP8) builds the histogram of every expert to place its own expert's pairs;
up to ``FEW_ROUTE_PAIRS`` pairs one program writes the same blocks from [pair, pair] comparisons. Times the op at
real routing, round-robin from CUDA graphs, with per-kernel device times and a bit check (the same blocks, so the
outputs must be bit-identical).
Usage: python bench/exp/few_route.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import routing

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16").split(","))
SETTINGS = {
    "E + 1 programs": {"FEW_ROUTE_PAIRS": 0},
    "one program up to 16 pairs": {"FEW_ROUTE_PAIRS": 16},
    "up to 64": {"FEW_ROUTE_PAIRS": 64},
    "up to 128": {"FEW_ROUTE_PAIRS": 128},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "few_route", routing, SETTINGS, BATCHES, seed=59)
