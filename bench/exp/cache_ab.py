"""Experiment: the op with the shipped cache against the shipped cache under the user's (a fresh ``tune``), same calls.

Each setting replaces ``autotune.pick_config`` with lookups in one ``ConfigCache`` of this GPU: "shipped" reads the
package's files alone (the GPU's own, then its siblings', as the op with no user cache), "tuned" the user's cache over
them (``$SGLANG_GLM5_CACHE_DIR``, as the op would). Times the op at
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


def compare_caches(out: Path, name: str, caches: dict[str, autotune.ConfigCache], batches) -> None:
    """Print the tiles each cache picks per layout and B, then time the op with each (the first the reference) at
    real routing, seed $BENCH_SEED (default 67)."""
    for layout_name, layout in bench_real.LAYOUTS.items():
        shape = MoeShape(layout.num_experts, layout.hidden, layout.inter)
        for b in batches:
            m = b * bench_real.TOP_K / bench_real.GLOBAL_EXPERTS
            picks = "; ".join(f"{k} {c.gemm1.label}, {c.gemm2.label}" for k, c in
                              ((k, cache.lookup(shape, m)) for k, cache in caches.items()))  # fmt: skip
            print(f"{layout_name} B={b:3d}: {picks}")
    settings = {k: {"pick_config": picker(cache)} for k, cache in caches.items()}
    seed = int(os.environ.get("BENCH_SEED", "67"))
    compare_settings(out, name, autotune, settings, batches, seed=seed)


if __name__ == "__main__":
    target = detect(torch.cuda.current_device())
    # What the op reads with no user cache: the shipped folder's files (the target's own, then its siblings').
    files = [p for p in autotune.cache_files(target) if p.parent == autotune.shipped_dir()]
    shipped = autotune.ConfigCache(target, files)
    compare_caches(Path(sys.argv[1]), "cache_ab", {"shipped": shipped, "tuned": autotune.ConfigCache(target)}, BATCHES)
