"""One decode-size call of the op on the GLM-5 EP8 layer, for Nsight Compute.

ncu --clock-control none --set full -k regex:nvfp4_moe_gemm -c 2 python3 bench/profile_decode.py
"""

import torch

from sglang_glm5.moe import nvfp4_fused_moe
from sglang_glm5.shapes import SHAPES
from sglang_glm5.testing import random_layer, random_routing

shape = SHAPES["glm5-ep8"]
gen = torch.Generator(device="cuda")
gen.manual_seed(1234)
layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
x = torch.randn(4, shape.hidden, generator=gen, device="cuda").bfloat16()
weights, ids = random_routing(4, shape.num_experts, shape.top_k, gen, device="cuda")
for _ in range(3):
    nvfp4_fused_moe(x, *layer.args(), weights, ids)
torch.cuda.synchronize()
