"""Experiment: how fast the W4A16 GEMMs decode when memory is not the limit.

One GLM-5 EP8 expert (H = 6144, I = 2048: 14.2 MB of gemm1 codes and scales, 7.1 MB of gemm2's) with T tokens all
routed to it (top_k 1), so each of T / 16 routing blocks decodes the whole expert and, past the first blocks to run,
reads it from L2 (50 MB on an H200). "hot": every call on the same layer; "cold": round-robin over COPIES copies, so
that each call's first reads come from DRAM (on the H200 the two measured the same). Per-kernel device times
from CUDA-graph replays; decoded bytes per second = blocks x the expert's bytes / kernel time, against the device copy
bandwidth measured in the same run. The hot rate is the kernels' decode ceiling on this GPU.
EXP_INTER sets I (default GLM-5's 2048): with a longer I each gemm2 program walks more K steps (I / block_k) per
pipeline start, which separates the cost of a program's start from that of its K steps.
Usage: python bench/exp/decode_ceiling.py OUT_DIR   (EXP_TOKENS, default 512; EXP_TILES, default the decode tiles;
EXP_INTER)
"""

import json
import os
import sys
from pathlib import Path

import torch
from decode_cases import generator, kernel_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig, MoeConfig

LAYOUT = bench_real.LAYOUTS["ep8"]
H = LAYOUT.hidden
INTER = int(os.environ.get("EXP_INTER", str(LAYOUT.inter)))
TOKENS = int(os.environ.get("EXP_TOKENS", "512"))
COPIES = 16
TILES = [t.split("/") for t in os.environ.get(
    "EXP_TILES", "16x64x256-w4-s2-gl/16x128x256-w4-s3,16x64x256-w4-s2-gl-gu/16x64x256-w4-s3,"
    "16x128x256-w4-s3/16x128x256-w4-s3").split(",")]  # fmt: skip

if __name__ == "__main__":
    out = Path(sys.argv[1])
    gen = generator(11)
    bw = bench_real.copy_bandwidth()
    layers = [random_layer(1, H, INTER, gen, "cuda").served() for _ in range(COPIES)]
    x = torch.randn(TOKENS, H, generator=gen, device="cuda").bfloat16()
    ids = torch.zeros(TOKENS, 1, dtype=torch.int32, device="cuda")
    w = torch.rand(TOKENS, 1, generator=gen, device="cuda")
    bytes1 = 2 * INTER * (H // 2 + H // 16)  # one expert's gemm1 codes and scales
    bytes2 = H * (INTER // 2 + INTER // 16)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {TOKENS} tokens; expert {bytes1 / 1e6:.1f} + "
          f"{bytes2 / 1e6:.1f} MB")  # fmt: skip
    rows = []
    for g1, g2 in TILES:
        cfg = MoeConfig(GemmConfig.from_label(g1), GemmConfig.from_label(g2))
        for name, copies in (("hot", 1), ("cold", COPIES)):

            def fn(copies=copies, cfg=cfg):
                for i in range(COPIES):
                    fused_moe(x, layers[i % copies], w, ids, config=cfg, check_ids=False, num_global_experts=1)

            us = kernel_us(fn, COPIES)
            # each routing block of a GEMM decodes the whole expert once
            r1 = TOKENS // cfg.gemm1.block_m * bytes1 / (us["gemm1"] * 1e-6)
            r2 = TOKENS // cfg.gemm2.block_m * bytes2 / (us["gemm2"] * 1e-6)
            rows.append({"gemm1": g1, "gemm2": g2, "mode": name, "kernels_us": us, "gemm1_Bps": r1, "gemm2_Bps": r2})
            print(
                f"{g1:>22s} {g2:>18s} {name:4s}: gemm1 {us['gemm1']:7.1f} us {r1 / 1e12:5.2f} TB/s "
                f"({r1 / bw:4.0%} of copy) | gemm2 {us['gemm2']:7.1f} us {r2 / 1e12:5.2f} TB/s ({r2 / bw:4.0%})"
            )
    (out / f"decode_ceiling_i{INTER}.json").write_text(
        json.dumps({"copy_Bps": bw, "tokens": TOKENS, "inter": INTER, "rows": rows}, indent=1)
    )
