"""Experiment: several N tiles a gemm2 program where I takes many K steps (GLM-5 EP8, I = 2048: 8 steps of 256).

EP8's gemm2 runs one N tile a program as two halves (``w4a16.halves``: 149 registers, three programs an SM), and each
program starts its copy pipeline anew for 8 K steps. The decode ceiling measured with I = 6144 (24 steps a program)
against 2048 has the same tiles 5-7 points of the copy bandwidth faster (bench/README.md, run 38): program starts
cost gemm2 at GLM-5's I. The flat (tile, K step) loop of ``MULTI_TILE`` keeps the pipeline running across tiles; in
halves (``GEMM2_FLAT_HALVES``) it takes 100-103 registers (sm_90 AOT, Triton 3.8) against 158-178 for whole tiles.

Settings, the op at real routing, round-robin from CUDA graphs over the same routings, each kernel's time and whether
the bits match the first: EP8's gemm2 at 1 tile a program (as shipped), 2 and 3 tiles in halves (the plan's halving
switched off), 2 whole tiles (``GEMM2_FLAT_HALVES`` off), and with gemm2's tile replaced by the 2-stage
16x128x256-w4-s2 (36864 B: five programs an SM in flat halves) at 1 and 2 tiles. TP8 (I = 256) keeps its own plan
and tiles in every setting, a control.
Usage: python bench/exp/gemm2_flat_ep8.py OUT_DIR   (EXP_BATCHES, default 16,32,64,128,256; BENCH_SEED)
"""

import os
import sys
from pathlib import Path

import triton
from decode_cases import compare_variants, tile_override

from sglang_glm5 import autotune
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "16,32,64,128,256").split(","))
DEFAULT = w4a16.gemm2_tiles_per_program
SHIPPED = {
    (w4a16, "gemm2_tiles_per_program"): DEFAULT,
    (w4a16, "MULTI_TILE_PROGRAMS_PER_SM"): w4a16.MULTI_TILE_PROGRAMS_PER_SM,
    (w4a16, "GEMM2_FLAT_HALVES"): w4a16.GEMM2_FLAT_HALVES,
    (autotune, "pick_config"): autotune.pick_config,
}


def many_steps(tiles: int):
    def per_program(inter, cfg):
        return tiles if triton.cdiv(inter, cfg.block_k) >= 4 else DEFAULT(inter, cfg)

    return per_program


def setting(tiles: int = 1, flat_halves: bool = True, gemm2: str | None = None):
    values = dict(SHIPPED)
    if tiles > 1:
        values[(w4a16, "gemm2_tiles_per_program")] = many_steps(tiles)
        values[(w4a16, "MULTI_TILE_PROGRAMS_PER_SM")] = 0
    values[(w4a16, "GEMM2_FLAT_HALVES")] = flat_halves
    if gemm2:  # at EP8 only (TP8's I = 256 is one K step of a 256-deep tile)
        override = tile_override(gemm2=gemm2)
        values[(autotune, "pick_config")] = lambda kind, m, e, h, inter, *a, **k: (
            override if inter >= 1024 else SHIPPED[(autotune, "pick_config")]
        )(kind, m, e, h, inter, *a, **k)
    return lambda: [setattr(module, attr, value) for (module, attr), value in values.items()]


VARIANTS = {
    "1 tile": setting(),
    "2 tiles halves": setting(2),
    "3 tiles halves": setting(3),
    "2 tiles whole": setting(2, flat_halves=False),
    "s2 1 tile": setting(gemm2="16x128x256-w4-s2"),
    "s2 2 tiles halves": setting(2, gemm2="16x128x256-w4-s2"),
}

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    try:
        compare_variants(Path(sys.argv[1]), "gemm2_flat_ep8", VARIANTS, BATCHES, seed=seed)
    finally:
        setting()()
