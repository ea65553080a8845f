"""Experiment: the tiles the heuristic could give both GEMMs at one to eight tokens per expert, in the op, same calls.

Each setting replaces ``autotune.pick_config`` with one tile for gemm1 and gemm2 at every step (no cache): the
128-deep tile the heuristic gave before (16x64x128-w4-s3, the reference), the 256-deep 3-stage tile (twice its shared
memory: one program per SM on an SM120 by shared memory, three on sm_90) and the 256-deep 2-stage tile (the
reference's shared memory). Times the op at real routing, round-robin from CUDA graphs on the same inputs, with
per-kernel device times.
Usage: python bench/exp/heuristic_tiles.py OUT_DIR   (EXP_BATCHES, default 32,64,128,256; BENCH_SEED, default 67)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import autotune
from sglang_glm5.tiles import GemmConfig, MoeConfig

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "32,64,128,256").split(","))
TILES = ("16x64x128-w4-s3", "16x64x256-w4-s3", "16x64x256-w4-s2")


def fixed(label: str):
    cfg = GemmConfig.from_label(label)

    def pick(path, tokens_per_expert, num_experts, hidden, inter, device):
        return MoeConfig(gemm1=cfg, gemm2=cfg)

    return pick


if __name__ == "__main__":
    settings = {label: {"pick_config": fixed(label)} for label in TILES}
    seed = int(os.environ.get("BENCH_SEED", "67"))
    compare_settings(Path(sys.argv[1]), "heuristic_tiles", autotune, settings, BATCHES, seed=seed)
