"""Experiment: on a GPU with no measured entries of its own (an H100), the op as it runs there today (its lookup falls
back to the heuristic tiles) against the op reading the H200's shipped entries (the same architecture, SM count and
shared memory per block), same calls.

Each setting replaces ``autotune.pick_config`` with lookups in one ``ConfigCache``: "own" is this GPU's (its files as
the op reads them), "h200" the package's h200.json read as the H200 reads it. Times the op at real routing,
round-robin from CUDA graphs on the same inputs, with per-kernel device times and the tiles each setting picked.
Usage: python bench/exp/sibling_cache.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; BENCH_SEED, 67)
"""

import os
import sys
from pathlib import Path

import torch
from cache_ab import picker
from decode_cases import compare_settings

from sglang_glm5 import autotune, bench_real
from sglang_glm5.hardware import TARGETS, detect
from sglang_glm5.shapes import MoeShape

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))

if __name__ == "__main__":
    here = detect(torch.cuda.current_device())
    sibling = TARGETS["h200"]
    assert (here.arch, here.sm_count, here.shared_per_block) == (sibling.arch, sibling.sm_count,
                                                                 sibling.shared_per_block), here  # fmt: skip
    own = autotune.ConfigCache(here)
    h200 = autotune.ConfigCache(sibling, [autotune.shipped_cache_path(sibling)])
    for name, layout in bench_real.LAYOUTS.items():
        shape = MoeShape(layout.num_experts, layout.hidden, layout.inter)
        for b in BATCHES:
            m = b * bench_real.TOP_K / bench_real.GLOBAL_EXPERTS
            a, t = own.lookup(shape, m), h200.lookup(shape, m)
            print(f"{name} B={b:3d}: own {a.gemm1.label}, {a.gemm2.label}; h200 {t.gemm1.label}, {t.gemm2.label}")
    settings = {"own": {"pick_config": picker(own)}, "h200": {"pick_config": picker(h200)}}
    seed = int(os.environ.get("BENCH_SEED", "67"))
    compare_settings(Path(sys.argv[1]), "sibling_cache", autotune, settings, BATCHES, seed=seed)
