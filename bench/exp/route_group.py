"""Experiment: routing programs that each place several experts' pairs.

Runs at commit eecea54, which has the switch (slower: bench/README.md run 25; reverted after it).

The routing launch ran E + 1 programs, each building the histogram of all ids and placing one expert's pairs: 257
programs at GLM-5 TP8 for a decode step of 8 pairs, where the launch took 3.3 us against 2.5 at EP8 (33 programs;
run 25 kernel times). With ``routing.route_group`` a program places up to ``ROUTE_GROUP_ELEMENTS`` / (ids per step)
experts at once (a [experts, ids] comparison and a cumulative sum along the ids): TP8 B = 1 takes 9 programs,
prefill steps one expert each. ``ROUTE_GROUP_ELEMENTS = 0`` gives one expert a program (the launch as before, in
the same code). Times the op at real routing both ways, per-kernel device times, bit check.
Usage: python bench/exp/route_group.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import routing

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
SETTINGS = {
    "one expert a program": {"ROUTE_GROUP_ELEMENTS": 0},
    "grouped": {"ROUTE_GROUP_ELEMENTS": routing.ROUTE_GROUP_ELEMENTS},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "route_group", routing, SETTINGS, BATCHES, seed=41)
