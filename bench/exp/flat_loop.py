"""Experiment: the shipped GEMM kernels (one N tile per program) against flat_kernels.py (a few programs
per routing block, each walking several N tiles in one pipelined K loop), each GEMM alone, GLM-5 EP8
(or the shape in $SHAPE, e.g. glm5-tp8, whose gemm2 has only 256 K columns), on the local GPU. Outputs
must be bit-identical (same arithmetic, same K order). Writes flat_loop[_SHAPE].json into the folder
given as the first argument."""

import json
import os
import sys
from functools import partial

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flat_kernels  # noqa: E402

from sglang_glm5 import moe  # noqa: E402
from sglang_glm5.bench import _balanced_routing  # noqa: E402
from sglang_glm5.shapes import parse_shape  # noqa: E402
from sglang_glm5.testing import random_layer  # noqa: E402
from sglang_glm5.tiles import GemmConfig  # noqa: E402

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
# (m, gemm, tile, programs per routing block to try)
CASES_TP8 = [
    (1, "gemm2", (16, 128, 128, 4, 3), (48, 24, 12, 8, 4)),
    (1, "gemm2", (16, 64, 256, 4, 3), (96, 48, 24, 12, 8)),
    (16, "gemm2", (16, 128, 128, 4, 3), (48, 24, 12, 8, 4)),
    (64, "gemm2", (64, 128, 128, 4, 3), (48, 24, 12, 8)),
]
CASES = [
    (1, "gemm2", (16, 64, 256, 4, 3), (48, 24, 16, 12, 8)),
    (1, "gemm2", (16, 128, 256, 8, 3), (24, 16, 12, 8)),
    (1, "gemm2", (16, 128, 256, 4, 3), (24, 16, 12, 8)),
    (1, "gemm1", (16, 128, 256, 4, 3), (8, 4)),
    (1, "gemm1", (16, 64, 256, 4, 3), (16, 8, 4)),
    (16, "gemm2", (16, 128, 256, 8, 3), (24, 16, 12, 8)),
    (16, "gemm2", (16, 64, 256, 4, 3), (48, 24, 16, 8)),
    (16, "gemm1", (16, 128, 256, 4, 3), (8, 4)),
    (32, "gemm2", (32, 128, 128, 8, 3), (24, 16, 12, 8)),
    (32, "gemm1", (32, 128, 256, 4, 3), (8, 4)),
    (64, "gemm2", (64, 128, 128, 8, 3), (24, 16, 8)),
    (64, "gemm1", (64, 128, 256, 8, 3), (8, 4)),
]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def launch_flat1(x, w13, s13, g13, route, h, cfg, top_k, programs):
    sorted_ids, block_expert = route
    w = w13.view(torch.int16)
    flat_kernels.gemm1_flat_kernel[(block_expert.numel(), programs)](
        x, w, s13.view(torch.uint8), g13, sorted_ids, block_expert, h,
        h.shape[0], top_k, h.shape[1], x.shape[1], x.stride(0), w.stride(0), w.stride(1), s13.stride(0),
        s13.stride(1), g13.stride(0), g13.stride(1) if g13.dim() == 2 else 0, h.stride(0), 0, h.shape[1],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=x.shape[1] % cfg.block_k == 0,
        INTERPRETER=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def launch_flat2(h, w2, s2, g2, tw, route, y, cfg, programs):
    sorted_ids, block_expert = route
    w = w2.view(torch.int16)
    flat_kernels.gemm2_flat_kernel[(block_expert.numel(), programs)](
        h, w, s2.view(torch.uint8), g2, tw, sorted_ids, block_expert, y,
        y.shape[0], y.shape[1], h.shape[1], h.stride(0), w.stride(0), w.stride(1), s2.stride(0), s2.stride(1),
        y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=h.shape[1] % cfg.block_k == 0,
        INTERPRETER=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


SHAPE = os.environ.get("SHAPE", "glm5-ep8")
if SHAPE == "glm5-tp8":
    CASES = CASES_TP8
shape = parse_shape(SHAPE)
gen = torch.Generator(device="cuda")
gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
w13, s13, g13, w2, s2, g2 = layer.args()
rows = []
triton.testing.do_bench(lambda: torch.empty(1 << 28, device="cuda").fill_(1.0), warmup=1000, rep=10)  # clocks up
inputs = {}
for m, gemm, tile, programs in CASES:
    if m not in inputs:
        weights, ids, tokens = _balanced_routing(shape, m, gen)
        x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
        h = (torch.randn(ids.numel(), shape.inter, generator=gen, device="cuda") * 0.1).bfloat16()
        inputs[m] = (weights.reshape(-1).contiguous(), ids, moe.prepare_activations(x), h)
    tw, ids, xp, h = inputs[m]
    P = ids.numel()
    cfg = GemmConfig(*tile)
    route = moe.align_pairs_by_expert(ids, shape.num_experts, cfg.block_m)
    if gemm == "gemm1":
        ref = torch.empty(P, shape.inter, dtype=xp.dtype, device="cuda")
        shipped = partial(moe._launch_gemm1, xp, w13, s13, g13, route, ref, cfg, shape.top_k, 0, shape.inter, False)
    else:
        ref = torch.empty(P, shape.hidden, dtype=xp.dtype, device="cuda")
        shipped = partial(moe._launch_gemm2, h, w2, s2, g2, tw, route, ref, cfg, False)
    shipped()
    t_shipped = bench(shipped)
    row = dict(m=m, gemm=gemm, cfg=cfg.label, ms_shipped=t_shipped, flat={})
    for p in programs:
        res = torch.empty_like(ref)
        if gemm == "gemm1":
            fn = partial(launch_flat1, xp, w13, s13, g13, route, res, cfg, shape.top_k, p)
        else:
            fn = partial(launch_flat2, h, w2, s2, g2, tw, route, res, cfg, p)
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:
            print(m, gemm, cfg.label, p, "failed:", str(e).splitlines()[0][:200], flush=True)
            continue
        row["flat"][p] = dict(ms=bench(fn), identical=torch.equal(res, ref))
    t_again = bench(shipped)  # drift check
    row["ms_shipped_again"] = t_again
    rows.append(row)
    print(row, flush=True)
name = "flat_loop.json" if SHAPE == "glm5-ep8" else f"flat_loop_{SHAPE}.json"
json.dump(rows, open(os.path.join(out_dir, name), "w"), indent=1)
