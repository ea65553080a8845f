"""Experiment: gemm2 waiting for its routing block's h alone, below one token per expert (GLM-5 B = 1-16).

Otherwise gemm2's programs wait in ``griddepcontrol.wait`` for the whole of gemm1 (PDL), then read their routing, fill
their copy pipeline and walk a few K steps: run 39 timed gemm2 on weights it had just read at 0.72-0.88x its time at
B = 1-4, so most of it is that chain, not DRAM. With per-block ready counters (``w4a16_plan.awaits_blocks``) gemm1 lets
gemm2 launch once every gemm1 program has started, and each gemm2 program reads its routing and waits for its block's
counter only, overlapping its start with gemm1's tail. Settings: ``w4a16_plan.AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT`` 0
(the whole of gemm1) and 1 (shipped: the counters where gemm2 walks several N tiles a program). At 66d8c82 this script
also timed the counters wherever the op is below one token per expert, an L2 prefetch of gemm2's weights before the
wait and a nanosleep between reads of the counter (bench/README.md, run 40); those settings are gone with the code.
The op at real routing, round-robin from CUDA graphs, with each kernel's device time and whether the bits match.
Usage: python bench/exp/ready_blocks.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16; BENCH_SEED, default 43)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16").split(","))

if __name__ == "__main__":
    settings = {
        "whole gemm1": {"AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT": 0},
        "ready": {"AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT": 1},
    }
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "ready_blocks", w4a16_plan, settings, BATCHES, seed)
