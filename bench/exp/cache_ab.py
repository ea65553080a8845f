"""Experiment: the op with the shipped cache against the shipped cache under the user's (a fresh ``tune``), same calls.

Each setting replaces ``autotune.pick_config`` with lookups in one ``ConfigCache`` of this GPU: "shipped" reads the
package's file alone, "tuned" the user's cache over it (``$SGLANG_GLM5_CACHE_DIR``, as the op would). Times the op at
real routing, round-robin from CUDA graphs on the same inputs, with per-kernel device times and the tiles each
setting picked per step.
Usage: python bench/exp/cache_ab.py OUT_DIR   (EXP_BATCHES, default 1,2,3,...,16; BENCH_SEED, default 67)
"""

import os
import sys
from pathlib import Path

import torch
from decode_cases import compare_settings

from sglang_glm5 import autotune, bench_real
from sglang_glm5.hardware import detect
from sglang_glm5.shapes import MoeShape

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", ",".join(map(str, range(1, 17)))).split(","))


def picker(cache: autotune.ConfigCache):
    def pick(path, tokens_per_expert, num_experts, hidden, inter, device):
        return cache.lookup(MoeShape(num_experts, hidden, inter), tokens_per_expert, path)

    return pick


if __name__ == "__main__":
    target = detect(torch.cuda.current_device())
    shipped = autotune.ConfigCache(target, [autotune.shipped_cache_path(target)])
    tuned = autotune.ConfigCache(target)
    for name, layout in bench_real.LAYOUTS.items():
        shape = MoeShape(layout.num_experts, layout.hidden, layout.inter)
        for b in BATCHES:
            m = b * bench_real.TOP_K / bench_real.GLOBAL_EXPERTS
            a, t = shipped.lookup(shape, m), tuned.lookup(shape, m)
            print(f"{name} B={b:3d}: shipped {a.gemm1.label}, {a.gemm2.label}; tuned {t.gemm1.label}, {t.gemm2.label}")
    settings = {"shipped": {"pick_config": picker(shipped)}, "tuned": {"pick_config": picker(tuned)}}
    seed = int(os.environ.get("BENCH_SEED", "67"))
    compare_settings(Path(sys.argv[1]), "cache_ab", autotune, settings, BATCHES, seed=seed)
