"""Experiment: gemm2's tile at GLM-5 B = 128-256, where every expert is busy with 4-8 pairs.

The op's decode at B = 256 took 8-10% longer than at B = 128 for the same weights (all 32 or 256 experts touched
either way; run 38), and TP8's gemm2 most of all (69 against 88 us): its cache entry at 8 tokens per expert was then
16x128x128-w4-s3 (two K steps, four N tiles a program), at 4 tokens 16x64x256-w4-s3 (one K step, eight); run 38 tuned
that bucket again from what this measured (bench/README.md). Each setting
replaces gemm2's tile at every B timed (``decode_cases.tile_override``); the op at real routing, round-robin from CUDA
graphs on the same inputs, each kernel's time and whether the bits match the cached tiles' (they need not: another
tile sums K in another order only where its block_k differs).
Usage: python bench/exp/gemm2_tiles_busy.py OUT_DIR   (EXP_BATCHES, default 128,192,256; EXP_TILES, comma-separated
labels, default TILES; BENCH_SEED)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings, tile_override

from sglang_glm5 import autotune

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "128,192,256").split(","))
TILES = tuple(
    os.environ.get("EXP_TILES", "16x64x256-w4-s3,16x64x256-w4-s2,16x128x256-w4-s3,16x128x128-w4-s3").split(",")
)

if __name__ == "__main__":
    settings = {"cached": {"pick_config": autotune.pick_config}}
    settings.update({label: {"pick_config": tile_override(gemm2=label)} for label in TILES})
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "gemm2_tiles_busy", autotune, settings, BATCHES, seed=seed)
