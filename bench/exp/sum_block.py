"""Experiment: the top-k sum's column block (``routing.SUM_BLOCK_H``, ``SUM_WARPS``) at decode.

At B = 1 the sum is one token: H / SUM_BLOCK_H programs (6 at GLM-5's H = 6144 with 1024 columns each), each adding
every valid slot's row of gemm2's output (and its K-split partials) for its columns. Narrower blocks spread the same
loads over more SMs. Times the op at real routing (the first variant is the op as shipped) with per-kernel device
times and a bit check (the sums are the same additions in the same order, so the outputs must be bit-identical).
Written before the op took 512 columns up to ``SUM_FEW_TOKENS`` tokens: each variant sets both block sizes.
Usage: python bench/exp/sum_block.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,64,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import routing

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,64,256").split(","))
SETTINGS = {
    f"{cols} cols, {warps} warps" if i == 0 else f"{cols}, {warps}": {
        "SUM_BLOCK_H": cols,
        "SUM_BLOCK_H_FEW": cols,
        "SUM_WARPS": warps,
    }
    for i, (cols, warps) in enumerate(((1024, 4), (512, 4), (256, 2), (256, 1)))
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "sum_block", routing, SETTINGS, BATCHES, seed=47)
