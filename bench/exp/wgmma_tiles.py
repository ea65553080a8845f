"""Experiment: tiles that the "kernel_wgmma" layout's lower register counts may let more programs per SM.

With the layout (sm_90, Triton 3.8 AOT, split form): gemm1 16x128x256-w4-s3 232 registers (2 programs of 4
warps per SM, as before), gemm1 16x128x128-w4-s3 160 registers and 49152 B (3 per SM), -s4 71680 B (3 per SM);
gemm2 16x128x256-w4-s2 as halves 139 registers and 34816 B. Times the op at real routing with one GEMM's tile
replaced at every B (``tile_override``), round-robin from CUDA graphs; the last variant repeats the first, to
show what the round-robin order alone does.
Usage: python bench/exp/wgmma_tiles.py OUT_DIR   (EXP_BATCHES, default 8,16,32,64,128,256)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings, tile_override

from sglang_glm5 import autotune

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8,16,32,64,128,256").split(","))
SETTINGS = {
    "cached": {"pick_config": autotune.pick_config},
    "g1 16x128x128-s3": {"pick_config": tile_override(gemm1="16x128x128-w4-s3")},
    "g1 16x128x128-s4": {"pick_config": tile_override(gemm1="16x128x128-w4-s4")},
    "g2 16x128x256-s2": {"pick_config": tile_override(gemm2="16x128x256-w4-s2")},
    "cached again": {"pick_config": autotune.pick_config},
}

if __name__ == "__main__":
    compare_settings(Path(sys.argv[1]), "wgmma_tiles", autotune, SETTINGS, BATCHES, seed=53)
