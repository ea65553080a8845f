"""Experiment: which gemm1 tile to run as a stream-K schedule at GLM-5 B = 8-16 (the cached 16x128x256 keeps 2
programs resident per SM; 16x64 tiles keep 3). Each setting replaces the cached gemm1 tile at every B timed
(``decode_cases.tile_override``); the op at real routing, round-robin from CUDA graphs on the same inputs.
Usage: python bench/exp/stream_tiles.py OUT_DIR   (EXP_BATCHES, default 8,12,16)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings, tile_override

from sglang_glm5 import autotune

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8,12,16").split(","))
TILES = ("16x128x256-w4-s3-sk2", "16x64x256-w4-s3-sk2", "16x64x256-w4-s3-sk3", "16x64x128-w4-s4-sk3")

if __name__ == "__main__":
    settings = {"cached": {"pick_config": autotune.pick_config}}
    settings.update({label: {"pick_config": tile_override(gemm1=label)} for label in TILES})
    compare_settings(Path(sys.argv[1]), "stream_tiles", autotune, settings, BATCHES, seed=71)
