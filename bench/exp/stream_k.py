"""Experiment: gemm1 as a stream-K schedule (``GemmConfig.stream``) against the planned grid, with the cached tiles.

With the planned grid a decode step's gemm1 runs (used blocks x N tiles x K splits) programs, the splits chosen on
the host from the blocks expected: on 132 SMs that leaves a partial last wave (GLM-5 TP8 B = 16: 206 programs of
24 K steps at 2 per SM, 58 SMs with one) or, at B <= 8, splits sized for blocks the step may not have. The stream-K
form runs a fixed number of persistent programs per SM that share every used (block, tile)'s K steps equally,
reading the blocks in use from the device; tiles cut between programs are added in program order by the last to
arrive. Times the op at real routing, round-robin from CUDA graphs on the same inputs, with per-kernel device times
(the outputs differ from the planned grid's in the fp32 rounding of the cut tiles: the rel diff column).
Usage: python bench/exp/stream_k.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; EXP_PER_SM 1,2,3)
"""

import dataclasses
import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import autotune

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
PER_SM = tuple(int(n) for n in os.environ.get("EXP_PER_SM", "1,2,3").split(","))


def streamed(per_sm: int):
    """``autotune.pick_config`` with gemm1 as a stream-K schedule of ``per_sm`` programs per SM (0: as cached)."""
    pick = autotune.pick_config

    def pick_with(*args, **kwargs):
        cfg = pick(*args, **kwargs)
        gemm1 = dataclasses.replace(cfg.gemm1.without_plan(), stream=per_sm) if per_sm else cfg.gemm1
        return dataclasses.replace(cfg, gemm1=gemm1)

    return pick_with


if __name__ == "__main__":
    settings = {"planned grid": {"pick_config": streamed(0)}}
    settings.update({f"stream {n}/SM": {"pick_config": streamed(n)} for n in PER_SM})
    compare_settings(Path(sys.argv[1]), "stream_k", autotune, settings, BATCHES, seed=61)
