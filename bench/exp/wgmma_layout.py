"""Experiment: the "kernel_wgmma" weight layout against "kernel" on the H200, the same weights and routings.

gemm1 16x128x256-w4-s3's K loop for sm_90 (Triton 3.8 AOT) loads and expands one block-scale byte per 32-bit
register of 8 codes: a wgmma register operand gives a thread words 2t, 2t + 1, 2t + 8 and 2t + 9 of each 16,
which lie in two blocks of 4 words. "kernel_wgmma" reorders the words of each group of 16 so that those four are
one block's (``nvfp4.WGMMA_GROUP_WORDS``), and the activations follow in a K order of period 64: the compiled
loop takes 1310 instructions a step against 1374 (LDS.U8 32 against 64, IMAD 311 against 343) and 232 registers
against 251; gemm2 16x128x256-w4-s3 as halves 128 against 147. Times the op at real routing, both layouts
round-robin from CUDA graphs (the first is "kernel", what the op ran on the H200 before), with per-kernel times
and the relative difference of the outputs (the K order differs, so the fp32 sums round apart).
Usage: python bench/exp/wgmma_layout.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256,2048,8192)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256,2048,8192").split(","))
LAYOUTS = ("kernel", "kernel_wgmma")


def bundles_for(variant: str, bundles: list) -> list:
    return [b.converted(variant) for b in bundles]


if __name__ == "__main__":
    compare_variants(Path(sys.argv[1]), "wgmma_layout", {v: lambda: None for v in LAYOUTS}, BATCHES, seed=47,
                     bundles_for=bundles_for)  # fmt: skip
