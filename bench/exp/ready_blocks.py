"""Experiment: gemm2 waiting for its routing block's h alone, below one token per expert (GLM-5 B = 1-16).

Shipped until now, gemm2's programs wait in ``griddepcontrol.wait`` for the whole of gemm1 (PDL), then read their
routing, fill their copy pipeline and walk a few K steps: run 39 timed gemm2 on weights it had just read at 0.72-0.88x
its time at B = 1-4, so most of it is that chain, not DRAM. With per-block ready counters (``w4a16.awaits_blocks``)
gemm1 lets gemm2 launch once every gemm1 program has started, and each gemm2 program reads its routing and waits for
its block's counter only, overlapping its start with gemm1's tail; with the prefetch it also asks the L2 for its
weights before waiting; with naps it sleeps between reads of the counter (``nanosleep``), so that the programs
waiting ask less of the L2 and the SMs while gemm1 runs. Settings, each against gemm2 waiting for the whole of gemm1
on the same inputs: ``w4a16.AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT`` (0: off), ``w4a16.GEMM2_PREFETCH`` and
``w4a16.READY_BACKOFF_NS``.
The op at real routing, round-robin from CUDA graphs, with each kernel's device time and whether the bits match.
Usage: python bench/exp/ready_blocks.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16; BENCH_SEED, default 43)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16").split(","))

if __name__ == "__main__":
    # every setting sets every attribute: compare_settings applies each in turn
    settings = {
        name: {"AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT": below, "GEMM2_PREFETCH": prefetch, "READY_BACKOFF_NS": naps}
        for name, below, prefetch, naps in (
            ("whole gemm1", 0, False, 0),
            ("ready", 1, False, 0),
            ("ready + prefetch", 1, True, 0),
            ("ready, 200 ns naps", 1, False, 200),
            ("ready, 1 us naps", 1, False, 1000),
        )
    }
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "ready_blocks", w4a16, settings, BATCHES, seed)
