"""Experiment: the op with the shipped cache against the same with its 2-stage Gluon gemm1 entries in gemm1's
gate-then-up order (``GemmConfig.gate_then_up``: a K step's four gate wgmmas, then up's; one matrix's packed words and
scale codes in registers at a time, 123-128 registers against 163, so four programs per SM instead of three). The
same splits, the same calls, the same bits expected.
Usage: python bench/exp/gate_then_up.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16,32,64,128,256; BENCH_SEED,
default 43)
"""

import dataclasses
import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5 import autotune
from sglang_glm5.variants import w4a16_gluon

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16,32,64,128,256").split(","))


def gate_then_up(pick):
    """``pick`` with each gemm1 entry of the 2-stage Gluon tile in the gate-then-up order."""

    def pick_with(*args, **kwargs):
        cfg = pick(*args, **kwargs)
        if cfg.gemm1.without_plan() != w4a16_gluon.TWO_STAGE_TILE:
            return cfg
        return dataclasses.replace(cfg, gemm1=dataclasses.replace(cfg.gemm1, gate_then_up=True))

    return pick_with


if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    settings = {"quarters": {"pick_config": autotune.pick_config},
                "gate_then_up": {"pick_config": gate_then_up(autotune.pick_config)}}  # fmt: skip
    compare_settings(Path(sys.argv[1]), f"gate_then_up_s{seed}", autotune, settings, BATCHES, seed=seed)
