"""Experiment: the op with the shipped cache, its Gluon gemm1 issuing a K step's wgmmas quarter by quarter (gate and
up of each quarter) against all of gate's quarters, then up's (``w4a16_gluon.GATE_THEN_UP``: one matrix's packed
words and scales in registers at a time; sm_90 AOT, Triton 3.6: 16x64x256-w4-s2 123-128 registers against 163, so
four programs per SM instead of three). Same calls, same bits expected.
Usage: python bench/exp/gate_then_up.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16,32,64,128,256; BENCH_SEED,
default 43)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_gluon

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16,32,64,128,256").split(","))

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    settings = {"quarters": {"GATE_THEN_UP": False}, "gate_then_up": {"GATE_THEN_UP": True}}
    compare_settings(Path(sys.argv[1]), f"gate_then_up_s{seed}", w4a16_gluon, settings, BATCHES, seed=seed)
