"""Experiment: the op with the GEMM kernels of another source (EXP_BASE_KERNELS: a kernels/nvfp4_moe.py, loaded under
another module name) against this revision's, round-robin from CUDA graphs on the same real routings, with per-kernel
device times and a bit check (a change that keeps the sums must keep the bits).

Run 28 (bench/README.md) used it with this revision's kernels changed to add, to each program's tile and K offsets, a
zero the compiler cannot prove (``(expert >> 31) * 1024`` of the block's expert, declared a multiple of 1024), so that
the block loop (BLOCK_LOOP: GLM-5 EP8 B <= 6) recomputes them per block instead of holding them in registers: sm_90
AOT, gemm1 16x64x256-w4-s3 split 234 -> 156 registers, 16x64x128-w4-s4 158 -> 112, gemm2 16x64x256-w4-s3 161 -> 120;
measured no faster, and not kept. TP8 and B >= 8 take no block loop: the control.
Usage: EXP_BASE_KERNELS=PATH python bench/exp/block_zero.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,5,6,8,16,64)
"""

import importlib.util
import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.kernels import nvfp4_moe
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,5,6,8,16,64").split(","))


def load_base(path: str):
    spec = importlib.util.spec_from_file_location("base_nvfp4_moe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    base = load_base(os.environ["EXP_BASE_KERNELS"])
    settings = {"previous kernels": {"_k": base}, "per-block zero": {"_k": nvfp4_moe}}  # as named in run 28
    compare_settings(Path(sys.argv[1]), "block_zero", w4a16, settings, BATCHES, seed=59)
