"""Experiment: gemm1 at chunked-prefill size with the operands swapped, the pairs as wgmma's M.

At B = 8192 (256 tokens per expert) gemm1 takes 1.46-1.49 ms of the op's 2.37 (EP8, run 26), at ~280 TFLOP/s: it
computes C^T = W X^T with the decoded weights as wgmma's register operand. Here C = X W^T: the pairs' activations
[BLOCK_M, BLOCK_K / 4] (shared memory) are the left operand and each decoded weight quarter, transposed, the right
one, which the compiler stores to shared memory once per program for every warp group to read: the weights are
decoded once per BLOCK_M pairs as before, but the tensor cores take both operands from shared memory. sm_90 AOT
(Triton 3.8): 128x64x64-w8-s4 229 registers, no spill; 128x64x128-w8-s3 255, no spill; 128-wide N tiles spill.
Times gemm1 alone, eagerly (median of ``bench_real._time``), on one real routing per layout, the op's gemm1 with its
cached tile against these kernels, and compares h with the op's (relative difference).
Usage: python bench/exp/prefill_swapped.py OUT_DIR   (EXP_BATCHES, default 8192; EXP_TILES)
"""

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from decode_cases import cached_config, generator

from sglang_glm5 import bench_real, routing
from sglang_glm5.kernels.moe_common import block_pairs, expert_rows, round_to, tile_columns
from sglang_glm5.kernels.nvfp4_decode import load_quarters, weight_tile
from sglang_glm5.kernels.nvfp4_moe import _permuted_column
from sglang_glm5.nvfp4 import LAYOUTS
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8192").split(","))
TILES = "128x64x64-w8-s4,128x64x128-w8-s3,128x64x64-w8-s3,256x64x64-w8-s3"
TILES = tuple(os.environ.get("EXP_TILES", TILES).split(","))


@triton.jit
def gemm1_swapped_kernel(
    x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, block_expert_ptr, h_ptr,
    num_pairs, top_k, inter_size, hidden_size, stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse,
    stride_gsg, stride_ht, gate_row0, up_row0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LAYOUT: tl.constexpr,
):  # fmt: skip
    """Grid (blocks, N tiles); K % BLOCK_K == 0. h as the op's gemm1 writes it (no split)."""
    e32 = tl.load(block_expert_ptr + tl.program_id(0))
    if e32 >= 0:
        offs_n, n_ok, offs_n_safe = tile_columns(tl.program_id(1), inter_size, BLOCK_N)
        expert = e32.to(tl.int64)
        pair, row_ok, pair_safe = block_pairs(sorted_ids_ptr, tl.program_id(0), num_pairs, BLOCK_M)
        token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)
        wg_rows, sg_rows = expert_rows(w_ptr, ws_ptr, expert, gate_row0 + offs_n_safe, stride_we, stride_wn,
                                       stride_se, stride_sn)  # fmt: skip
        wu_rows, su_rows = expert_rows(w_ptr, ws_ptr, expert, up_row0 + offs_n_safe, stride_we, stride_wn,
                                       stride_se, stride_sn)  # fmt: skip
        x_rows = x_ptr + token * stride_xt
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        tl.assume(hidden_size > 0)
        for k0 in range(0, hidden_size, BLOCK_K):
            x0, x1, x2, x3 = load_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K, True, False)
            g0, g1, g2, g3 = weight_tile(wg_rows, sg_rows, k0, hidden_size, BLOCK_K, True, x0.dtype, LAYOUT, False)
            acc_g = tl.dot(tl.trans(x0), tl.trans(g0), acc_g)
            acc_g = tl.dot(tl.trans(x1), tl.trans(g1), acc_g)
            acc_g = tl.dot(tl.trans(x2), tl.trans(g2), acc_g)
            acc_g = tl.dot(tl.trans(x3), tl.trans(g3), acc_g)
            u0, u1, u2, u3 = weight_tile(wu_rows, su_rows, k0, hidden_size, BLOCK_K, True, x0.dtype, LAYOUT, False)
            acc_u = tl.dot(tl.trans(x0), tl.trans(u0), acc_u)
            acc_u = tl.dot(tl.trans(x1), tl.trans(u1), acc_u)
            acc_u = tl.dot(tl.trans(x2), tl.trans(u2), acc_u)
            acc_u = tl.dot(tl.trans(x3), tl.trans(u3), acc_u)
        gate = acc_g * (tl.load(wgs_ptr + expert * stride_gse) * 128.0)  # DECODE_UNSCALE
        up = acc_u * (tl.load(wgs_ptr + expert * stride_gse + stride_gsg) * 128.0)
        h = gate / (1.0 + tl.exp(-gate)) * up
        h_ptrs = h_ptr + pair_safe[:, None] * stride_ht + _permuted_column(offs_n, LAYOUT == 2)[None, :]
        tl.store(h_ptrs, round_to(h, h_ptr.dtype.element_ty, False), mask=row_ok[:, None] & n_ok[None, :])


def swapped(xp, bundle, route, h, cfg: GemmConfig, top_k):
    w13 = bundle.w13.view(torch.int16)
    gate_row0, up_row0 = bundle.gate_up_rows
    gs = bundle.w13_scale_2
    grid = (route.block_expert.numel(), triton.cdiv(h.shape[1], cfg.block_n))
    gemm1_swapped_kernel[grid](
        xp, w13, bundle.w13_scale.view(torch.uint8), gs, route.sorted_ids, route.block_expert, h,
        h.shape[0], top_k, h.shape[1], xp.shape[1], xp.stride(0), w13.stride(0), w13.stride(1),
        bundle.w13_scale.stride(0), bundle.w13_scale.stride(1), gs.stride(0), gs.stride(1) if gs.dim() == 2 else 0,
        h.stride(0), gate_row0, up_row0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, LAYOUT=LAYOUTS.index(bundle.layout),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def op_gemm1(xp, bundle, route, h, cfg: GemmConfig, top_k):
    gate_row0, up_row0 = bundle.gate_up_rows
    w4a16.launch_gemm1(xp, bundle.w13, bundle.w13_scale, bundle.w13_scale_2, route, h, cfg, top_k, gate_row0, up_row0,
                       False, layout=bundle.layout)  # fmt: skip


def time_case(name: str, layout, bundle, batch: int, gen) -> dict:
    _, ids = bench_real.real_routing(batch, layout, gen)
    x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
    xp = routing.prepare_activations(x, bundle.layout)
    top_k = ids.shape[1]
    cfg = cached_config(layout, batch).gemm1
    route = routing.route_pairs(ids, layout.num_experts, cfg.block_m)
    ref = torch.zeros(ids.numel(), layout.inter, dtype=torch.bfloat16, device="cuda")  # rows of -1 pairs stay 0
    op = partial(op_gemm1, xp, bundle, route, ref, cfg, top_k)
    op()
    times = {f"op {cfg.label}": bench_real._time(op, False, 1)}
    rel = {}
    for label in TILES:
        tile = GemmConfig.from_label(label)
        r = routing.route_pairs(ids, layout.num_experts, tile.block_m)
        h = torch.zeros_like(ref)
        try:
            swapped(xp, bundle, r, h, tile, top_k)
            torch.cuda.synchronize()
        except Exception as exc:  # a tile that does not compile or launch: say so, go on
            print(f"{name} B={batch} {label}: {type(exc).__name__}: {exc}", flush=True)
            continue
        rel[label] = ((h.float() - ref.float()).norm() / ref.float().norm()).item()
        times[label] = bench_real._time(partial(swapped, xp, bundle, r, h, tile, top_k), False, 1)
    flops = 2 * ids.ge(0).sum().item() * layout.hidden * 2 * layout.inter
    base = next(iter(times.values()))
    cells = []
    for k, v in times.items():
        extra = f", rel {rel[k]:.1e}" if k in rel else ""
        cells.append(f"{k} {v * 1e3:8.1f} us ({v / base:.3f}, {flops / v / 1e9:.0f} TFLOP/s{extra})")  # v in ms
    print(f"{name} B={batch} | " + " | ".join(cells), flush=True)
    return {"layout": name, "batch": batch, "ms": times, "rel_diff": rel}


def main(out: Path) -> None:
    gen = generator(59)
    rows = []
    for name in ("ep8", "tp8"):
        layout = bench_real.LAYOUTS[name]
        bundle = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served()
        rows += [time_case(name, layout, bundle, batch, gen) for batch in BATCHES]
    (out / "prefill_swapped.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
