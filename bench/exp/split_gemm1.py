"""Experiment: gemm1 as one plain GEMM over the 2I rows (gemm2's kernel, one accumulator) against the fused
gate/up kernel, on the local GPU. Writes split_gemm1.json into the folder given as the first argument."""

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
shape = parse_shape("glm5-ep8")
gen = torch.Generator(device="cuda")
gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
w13, s13, g13 = layer.args()[:3]
g13_one = g13.reshape(g13.shape[0], -1)[:, 0].contiguous()
rows = []
for m in (1, 16, 32):
    weights, ids, tokens = balanced_routing(shape, m, gen)
    x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
    xp = routing.prepare_activations(x)
    P = ids.numel()
    bm = 16 if m <= 16 else 32
    fused = GemmConfig(bm, 128, 256, 4, 3)
    route = routing.route_pairs(ids, shape.num_experts, bm)
    h = torch.empty(P, shape.inter, dtype=x.dtype, device="cuda")
    t = triton.testing.do_bench(
        partial(w4a16.launch_gemm1, xp, w13, s13, g13, route, h, fused, shape.top_k, 0, shape.inter, False),
        warmup=10,
        rep=60,
        return_mode="median",
    )
    rows.append(dict(m=m, kernel="gemm1 fused", cfg=fused.label, ms=t))
    print(rows[-1], flush=True)
    # plain GEMM over 2I rows: activations per pair (gathered x), as gemm2 reads h
    xpairs = xp[torch.arange(P, device="cuda") // shape.top_k].contiguous()
    y = torch.empty(P, 2 * shape.inter, dtype=x.dtype, device="cuda")
    ones = torch.ones(P, device="cuda")
    for cfg in (
        GemmConfig(bm, 64, 256, 4, 3),
        GemmConfig(bm, 128, 256, 4, 3),
        GemmConfig(bm, 128, 256, 8, 3),
        GemmConfig(bm, 64, 512, 4, 3),
        GemmConfig(bm, 64, 128, 4, 4),
        GemmConfig(bm, 128, 128, 4, 4),
    ):
        try:
            fn = partial(w4a16.launch_gemm2, xpairs, w13, s13, g13_one, ones, route, y, cfg, False)
            fn()
            torch.cuda.synchronize()
            t = triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
        except Exception as e:
            print(m, cfg.label, "failed", e, flush=True)
            continue
        rows.append(dict(m=m, kernel="plain 2I GEMM", cfg=cfg.label, ms=t))
        print(rows[-1], flush=True)
json.dump(rows, open(os.path.join(out_dir, "split_gemm1.json"), "w"), indent=1)
