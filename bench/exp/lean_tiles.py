"""Experiment: decode tiles of fewer registers, now that neither the block loop nor the split reduction adds them.

Runs at commit 61d831b, which has both switches (the cached tiles won: bench/README.md run 25; reverted after it).

With the block loop unrolled in rounds and gemm1's split partials added two at a time (``w4a16.MAX_BLOCK_ROUNDS``,
``REDUCE_AT_ONCE``), gemm1 16x64x128-w4-s4 compiles to 96 registers a thread at 12 splits (sm_90 AOT, Triton 3.8;
161 in the loop), 5 programs of 4 warps per SM against 2 for the cached 16x128x256-w4-s3 (shared memory holds that
one to 2). This times the op at real routing with the cached tiles (partials all at once, the op's default before)
and with one GEMM's tile replaced by a leaner one, at the op's own split plan.
Usage: python bench/exp/lean_tiles.py OUT_DIR   (EXP_BATCHES, default 4,16,64,256)
"""

import dataclasses
import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5 import autotune
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "4,16,64,256").split(","))
PICK, AT_ONCE = autotune.pick_config, w4a16.REDUCE_AT_ONCE


def setting(gemm: str | None, label: str | None, at_once: int):
    def pick(*args, **kwargs):
        cfg = PICK(*args, **kwargs)
        return dataclasses.replace(cfg, **{gemm: GemmConfig.from_label(label)}) if gemm else cfg

    def setup():
        autotune.pick_config, w4a16.REDUCE_AT_ONCE = pick, at_once

    return setup


VARIANTS = {
    "cache": setting(None, None, 0),
    "g1 16x64x128-w4-s4": setting("gemm1", "16x64x128-w4-s4", 2),
    "g1 16x64x256-w4-s4": setting("gemm1", "16x64x256-w4-s4", 2),
    "g2 16x64x128-w4-s4": setting("gemm2", "16x64x128-w4-s4", 2),
    "g2 16x64x256-w4-s3": setting("gemm2", "16x64x256-w4-s3", 2),
}

if __name__ == "__main__":
    try:
        compare_variants(Path(sys.argv[1]), "lean_tiles", VARIANTS, BATCHES, seed=41)
    finally:
        autotune.pick_config, w4a16.REDUCE_AT_ONCE = PICK, AT_ONCE
