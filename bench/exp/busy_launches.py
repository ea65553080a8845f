"""Experiment: the launches around the GEMMs at GLM-5 B = 32-256, where every expert (EP8) or most (TP8) is busy.

Beside the GEMMs the op spends 5-16 us there on the routing launch and the top-k sum (run 39: TP8 B = 256 8.2 and
7.4 us). Settings, each against the shipped op on the same inputs: the routing as two launches over chunks of the ids
(``routing.CHUNKED_ROUTE_PAIRS`` lowered to 256 pairs, where it is 8192: TP8's E + 1 = 257 routing programs each walk
all P ids twice), and, apart, programmatic dependent launch for all four launches up to 16 tokens per expert
(``w4a16_plan.PDL_BELOW_TOKENS_PER_EXPERT``; run 20 measured it 1-4% slower at busy sizes on the kernels of then; with
PDL the routing is one launch whatever its size).
The op at real routing, round-robin from CUDA graphs, with each kernel's device time and whether the bits match.
Usage: python bench/exp/busy_launches.py OUT_DIR   (EXP_BATCHES, default 32,64,128,256; BENCH_SEED, default 43)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5 import routing
from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "32,64,128,256").split(","))
SHIPPED = {"chunked": routing.CHUNKED_ROUTE_PAIRS, "pdl": w4a16_plan.PDL_BELOW_TOKENS_PER_EXPERT}


def setting(chunked: int, pdl: float):
    def setup():
        routing.CHUNKED_ROUTE_PAIRS = chunked
        w4a16_plan.PDL_BELOW_TOKENS_PER_EXPERT = pdl

    return setup


if __name__ == "__main__":
    variants = {
        "shipped": setting(SHIPPED["chunked"], SHIPPED["pdl"]),
        "chunked route": setting(256, SHIPPED["pdl"]),
        "pdl": setting(SHIPPED["chunked"], 16),
    }
    try:
        compare_variants(Path(sys.argv[1]), "busy_launches", variants, BATCHES, int(os.environ.get("BENCH_SEED", "43")))
    finally:
        setting(SHIPPED["chunked"], SHIPPED["pdl"])()
