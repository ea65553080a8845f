"""Experiment: gemm1's programs ask the L2 for gemm2's weights, at GLM-5 B = 1-16 (below one token per expert).

There the GEMMs decode at 28-61% of the copy bandwidth (run 38): DRAM has room while gemm1 runs, and gemm2 then reads
its experts' weights (a third of the bytes) after gemm1 ends. Settings against the shipped op on the same inputs:
"gemm2 twice" launches gemm2 a second time right after the first, whose weights the first just read (what gemm2
costs with its weights in L2, at most: that second launch's time is the setting's gemm2 time less the shipped one);
"prefetch" and "prefetch evict_last": gemm1 (Gluon) issues ``cp.async.bulk.prefetch.L2`` of its expert's gemm2 codes
and scales, a share per program (``w4a16.GEMM2_PREFETCH_BELOW_TOKENS_PER_EXPERT``, ``GEMM2_PREFETCH_MODE``). The op at
real routing, round-robin from CUDA graphs, each kernel's device time, whether the bits match.
Usage: python bench/exp/gemm2_prefetch.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16; BENCH_SEED, default 43)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16").split(","))
LAUNCH_GEMM2 = w4a16.launch_gemm2
SHIPPED = (w4a16.GEMM2_PREFETCH_BELOW_TOKENS_PER_EXPERT, w4a16.GEMM2_PREFETCH_MODE)


def twice(*args, **kwargs):
    LAUNCH_GEMM2(*args, **kwargs)
    LAUNCH_GEMM2(*args, **kwargs)


def setting(launch_gemm2, below: float, mode: int):
    def setup():
        w4a16.launch_gemm2 = launch_gemm2
        w4a16.GEMM2_PREFETCH_BELOW_TOKENS_PER_EXPERT = below
        w4a16.GEMM2_PREFETCH_MODE = mode

    return setup


if __name__ == "__main__":
    variants = {
        "shipped": setting(LAUNCH_GEMM2, *SHIPPED),
        "gemm2 twice": setting(twice, *SHIPPED),
        "prefetch": setting(LAUNCH_GEMM2, 1.0, 1),
        "prefetch evict_last": setting(LAUNCH_GEMM2, 1.0, 2),
    }
    try:
        seed = int(os.environ.get("BENCH_SEED", "43"))
        compare_variants(Path(sys.argv[1]), "gemm2_prefetch", variants, BATCHES, seed)
    finally:
        setting(LAUNCH_GEMM2, *SHIPPED)()
