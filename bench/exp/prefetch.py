"""Experiment: the op with L2 prefetches of the weights ahead of the GEMMs' copy pipelines, against none, same calls.

gemm1 (Gluon, ``w4a16_gluon.PREFETCH``): each program prefetches the packed words and scale codes of the K step
PREFETCH steps past its cp.async ring. gemm2 (Triton, ``w4a16.GEMM2_PREFETCH``): its first steps before it waits for
gemm1 (PDL), then the step that many ahead in its loop. A prefetch is a hint: the bits must not change.
Usage: python bench/exp/prefetch.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; BENCH_SEED, default 43;
EXP_PREFETCH, default "0:0,4:0,0:8,4:8,8:8": gemm1:gemm2 distances, the first the reference)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5.variants import w4a16, w4a16_gluon

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
PAIRS = [tuple(int(v) for v in p.split(":")) for p in os.environ.get("EXP_PREFETCH", "0:0,4:0,0:8,4:8,8:8").split(",")]


def setting(g1: int, g2: int):
    def setup():
        w4a16_gluon.PREFETCH = g1
        w4a16.GEMM2_PREFETCH = g2

    return setup


if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    variants = {f"pf{g1}:{g2}": setting(g1, g2) for g1, g2 in PAIRS}
    try:
        compare_variants(Path(sys.argv[1]), f"prefetch_s{seed}", variants, BATCHES, seed)
    finally:
        setting(0, 0)()
