"""Experiment: N tiles per gemm2 program where I is one K step (GLM-5 TP8, I = 256), at real routing.

``w4a16_plan.gemm2_tiles_per_program`` gives 8 there (as many tiles as fit in 8 K steps; the plan halves it while the
programs would not fill the GPU twice), chosen on balanced routing (run r2). This times the op with 8 (the default),
4, 2 and 16 at decode sizes, round-robin from CUDA graphs over the same routings, with each kernel's time; I of
several K steps (EP8) keeps its one tile a program in every setting, so EP8 is a control.
Usage: python bench/exp/gemm2_per_program.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; BENCH_SEED)
"""

import os
import sys
from pathlib import Path

import triton
from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
DEFAULT = w4a16_plan.gemm2_tiles_per_program


def one_step(tiles: int):
    def per_program(inter, cfg):
        return tiles if triton.cdiv(inter, cfg.block_k) == 1 else DEFAULT(inter, cfg)

    return per_program


SETTINGS = {f"{n} tiles": {"gemm2_tiles_per_program": one_step(n)} for n in (8, 4, 2, 16)}

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "gemm2_per_program", w4a16_plan, SETTINGS, BATCHES, seed=seed)
