"""Experiment: the K split plans of the chains on SM shares (``w4a16_plan.CHAIN_SM_SHARE``).

The cached split plans (``GemmConfig.programs_per_sm``, from ``tune --splits-only``) were timed on one GEMM of one
chain with the whole GPU; the shipped two chains at GLM-5 EP8 B = 4-16 each plan for half the SMs with that same
target, and the two run side by side, so the best target for a chain may differ. This times the op with other
targets for gemm1 or gemm2 (the other GEMM as cached) against the op as shipped, round-robin from CUDA graphs
(``compare_settings``). Since run 53 the chains keep one chain's K splits (``plan_gemms(like=...)``): a target here
sets both, and at GLM-5 EP8 B = 4-16 the chains' own plans had split alike.
Usage: python bench/exp/chain_splits.py OUT_DIR   (EXP_BATCHES, default 4,8,16; BENCH_SEED, default 43;
EXP_TARGETS, default 1,2,3,4,6,8: at most ``tiles.MAX_PROGRAMS_PER_SM``; EXP_LAYOUTS, default ep8)
"""

import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("EXP_LAYOUTS", "ep8")

from decode_cases import compare_settings  # noqa: E402

from sglang_glm5 import autotune  # noqa: E402

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "4,8,16").split(","))
TARGETS = tuple(int(t) for t in os.environ.get("EXP_TARGETS", "1,2,3,4,6,8").split(","))


def with_target(gemm: str, target: int):
    """``autotune.pick_config`` with one GEMM's split target replaced (its tile kept), for ``compare_settings``."""
    pick = autotune.pick_config

    def pick_with(*args, **kwargs):
        cfg = pick(*args, **kwargs)
        tile = getattr(cfg, gemm)
        if tile.split_k or tile.stream:  # a fixed split, or a stream-K schedule (no split target): leave it
            return cfg
        return dataclasses.replace(cfg, **{gemm: dataclasses.replace(tile, programs_per_sm=target)})

    return pick_with


if __name__ == "__main__":
    settings = {"shipped": {}}
    for gemm in ("gemm1", "gemm2"):
        for t in TARGETS:
            settings[f"{gemm} p{t}"] = {"pick_config": with_target(gemm, t)}
    compare_settings(Path(sys.argv[1]), "chain_splits", autotune, settings, BATCHES,
                     int(os.environ.get("BENCH_SEED", "43")))  # fmt: skip
