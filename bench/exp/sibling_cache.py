"""Experiment: on a GPU with no measured entries of its own (an H100), the op with its own cache against the op reading
the H200's shipped entries (the same architecture, SM count and shared memory per block), same calls.

Each setting replaces ``autotune.pick_config`` with lookups in one ``ConfigCache``: "own" is this GPU's (its files as
the op reads them: before run 45 the heuristic tiles; since, the H200's entries as a sibling's, ``autotune.siblings``,
so that the two pick the same tiles unless this GPU has entries of its own), "h200" the package's h200.json read as
the H200 reads it. Times the op at real routing, round-robin from CUDA graphs on the same inputs, with per-kernel
device times and the tiles each setting picked.
Usage: python bench/exp/sibling_cache.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; BENCH_SEED, 67)
"""

import os
import sys
from pathlib import Path

import torch
from cache_ab import compare_caches

from sglang_glm5 import autotune
from sglang_glm5.hardware import TARGETS, detect

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))

if __name__ == "__main__":
    here = detect(torch.cuda.current_device())
    sibling = TARGETS["h200"]
    assert (here.arch, here.sm_count, here.shared_per_block) == (sibling.arch, sibling.sm_count,
                                                                 sibling.shared_per_block), here  # fmt: skip
    own = autotune.ConfigCache(here)
    h200 = autotune.ConfigCache(sibling, [autotune.shipped_cache_path(sibling)])
    compare_caches(Path(sys.argv[1]), "sibling_cache", {"own": own, "h200": h200}, BATCHES)
