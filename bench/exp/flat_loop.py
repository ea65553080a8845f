"""Experiment: gemm2 with one N tile per program against several (``w4a16.launch_gemm2``'s per_program),
each alone, on the local GPU, for the layer shape in $SHAPE (glm5-ep8 or glm5-tp8). Outputs must be
bit-identical (same arithmetic, same K order). Writes flat_loop[_SHAPE].json into the folder given as
the first argument.

The EP8 results in bench/h200/runs/exp_flat_loop.json also cover gemm1 with several N tiles per program
(slower at every m); that variant lived in bench/exp/flat_kernels.py, removed after commit 6704eea.
"""

import json
import os
import sys
from functools import partial

import torch
import triton
import triton.testing

from sglang_glm5 import routing
from sglang_glm5.bench import balanced_routing
from sglang_glm5.shapes import parse_shape
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
# (m, tile, N tiles per program to try); 1 = one tile per program
CASES = {
    "glm5-tp8": [
        (1, (16, 128, 128, 4, 3), (1, 2, 4, 6, 12)),
        (1, (16, 64, 256, 4, 3), (1, 2, 4, 8, 12)),
        (16, (16, 128, 128, 4, 3), (1, 2, 4, 6, 12)),
        (64, (64, 128, 128, 4, 3), (1, 2, 4, 6)),
    ],
    "glm5-ep8": [
        (1, (16, 64, 256, 4, 3), (1, 2, 4, 6, 8)),
        (16, (16, 128, 256, 8, 3), (1, 2, 3, 4, 6)),
        (32, (32, 128, 128, 8, 3), (1, 2, 3, 4, 6)),
        (64, (64, 128, 128, 8, 3), (1, 2, 3, 6)),
    ],
}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


SHAPE = os.environ.get("SHAPE", "glm5-ep8")
shape = parse_shape(SHAPE)
gen = torch.Generator(device="cuda")
gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
rows = []
triton.testing.do_bench(lambda: torch.empty(1 << 28, device="cuda").fill_(1.0), warmup=1000, rep=10)  # clocks up
for m, tile, per_program in CASES[SHAPE]:
    weights, ids, _ = balanced_routing(shape, m, gen)
    h = (torch.randn(ids.numel(), shape.inter, generator=gen, device="cuda") * 0.1).bfloat16()
    cfg = GemmConfig(*tile)
    route = routing.route_pairs(ids, shape.num_experts, cfg.block_m)
    args = (h, layer.w2, layer.w2_scale, layer.w2_scale_2, weights.reshape(-1).contiguous(), route)
    outs, row = {}, dict(m=m, gemm="gemm2", cfg=cfg.label, ms={})
    for p in per_program:
        y = torch.empty(ids.numel(), shape.hidden, dtype=h.dtype, device="cuda")
        fn = partial(w4a16.launch_gemm2, *args, y, cfg, False, per_program=p)
        fn()
        torch.cuda.synchronize()
        outs[p] = y
        row["ms"][p] = bench(fn)
    row["identical"] = all(torch.equal(outs[p], outs[per_program[0]]) for p in per_program)
    rows.append(row)
    print(row, flush=True)
name = "flat_loop.json" if SHAPE == "glm5-ep8" else f"flat_loop_{SHAPE}.json"
json.dump(rows, open(os.path.join(out_dir, name), "w"), indent=1)
