"""Experiment: the block loop unrolled in rounds, and gemm1's split reduction a few partials at a time.

Runs at commit 61d831b, which has both switches (neither kept: bench/README.md run 25; reverted after it).

Both trade latency for registers. A GEMM launch with fewer block programs than possible routing blocks walks the
used blocks in a loop (``BLOCK_LOOP``), which costs 40-80 registers a thread and spills some tiles (sm_90 AOT,
Triton 3.8: gemm1 16x128x256-w4-s3 at 12 splits 255 and a 280 B spill); unrolled in at most
``w4a16.MAX_BLOCK_ROUNDS`` rounds it takes 237 and no spill (16x64x128-w4-s4: 96 against 161). gemm1's last program of
a split tile loaded all SPLITS partials at once; ``w4a16.REDUCE_AT_ONCE`` at a time keeps those registers flat in
the split count, at one L2 round trip per group. This times the op at real routing under each setting (the first,
the loop and all partials at once, is the op before both), with per-kernel device times and a bit-identity check
(the sum's order is the same in every variant).
Usage: python bench/exp/block_rounds.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16,32,64,128,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16,32,64,128,256").split(","))
DEFAULTS = (w4a16.MAX_BLOCK_ROUNDS, w4a16.REDUCE_AT_ONCE)


def setting(rounds: int, at_once: int):
    def setup():
        w4a16.MAX_BLOCK_ROUNDS, w4a16.REDUCE_AT_ONCE = rounds, at_once

    return setup


VARIANTS = {
    "loop, all": setting(0, 0),
    "rounds, all": setting(4, 0),
    "rounds, 2": setting(4, 2),
    "rounds, 4": setting(4, 4),
}

if __name__ == "__main__":
    try:
        compare_variants(Path(sys.argv[1]), "block_rounds", VARIANTS, BATCHES, seed=41)
    finally:
        w4a16.MAX_BLOCK_ROUNDS, w4a16.REDUCE_AT_ONCE = DEFAULTS
