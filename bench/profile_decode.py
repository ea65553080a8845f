"""One decode-size call of the op, for Nsight Compute.

ncu --clock-control none --set full -k regex:nvfp4_moe_gemm -c 2 python3 bench/profile_decode.py

The layer as the plugin keeps it (``MoeLayer.served``: the kernel weight layout). Default: the GLM-5 EP8 layer, 4
tokens routed uniformly over its 32 experts (balanced). With PROFILE_LAYOUT=ep8 or
tp8: PROFILE_TOKENS tokens (default 1) at real routing (top-8 of 256, ``bench_real.real_routing``; a draw with at
least one local slot), called as the plugin calls it (``num_global_experts=256``).
"""

import os

import torch

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.shapes import SHAPES
from sglang_glm5.testing import random_layer, random_routing

gen = torch.Generator(device="cuda")
gen.manual_seed(1234)
layout_name = os.environ.get("PROFILE_LAYOUT")
if layout_name:
    layout = bench_real.LAYOUTS[layout_name]
    tokens = int(os.environ.get("PROFILE_TOKENS", "1"))
    layer = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda")
    weights, ids = bench_real.real_routing(tokens, layout, gen)
    while not bool((ids >= 0).any()):
        weights, ids = bench_real.real_routing(tokens, layout, gen)
    kwargs = {"num_global_experts": bench_real.GLOBAL_EXPERTS}
    print(f"{layout_name}: {tokens} tokens, {int((ids >= 0).sum())} local slots", flush=True)
else:
    shape = SHAPES["glm5-ep8"]
    tokens = 4
    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
    weights, ids = random_routing(tokens, shape.num_experts, shape.top_k, gen, device="cuda")
    kwargs = {}
x = torch.randn(tokens, layer.w13.shape[2] * 2, generator=gen, device="cuda").bfloat16()
bundle = layer.served()
for _ in range(3):
    fused_moe(x, bundle, weights, ids, **kwargs)
torch.cuda.synchronize()
