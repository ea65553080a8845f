"""Check: the op's error against the float64 reference with one chain, two and four, for a tile config and the
default lookup (a layer of 32 experts, H = I = 512, EP-like routing), to place an error between the chains and the
tiles. A tile whose decode would pair two scale blocks on this GPU and Triton is refused by the op at its launch
(``variants.w4a16_pairs``): printed as refused. Usage: python bench/exp/two_chains_check.py OUT_DIR"""

import torch

from sglang_glm5.moe import fused_moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16_plan
from sglang_glm5.weights import Nvfp4MoeWeights

w4a16_plan.EAGER_CHAINS = True  # every call below runs the chains it names, not one chain after a first
gen = torch.Generator().manual_seed(5)
layer = random_layer(32, 512, 512, gen)
weights = Nvfp4MoeWeights.build(*(a.cuda() for a in layer.args())).for_device()
print("layout", weights.layout)
for tokens in (2, 64):
    x = torch.randn(tokens, 512, generator=gen).bfloat16()
    w, ids = random_routing(tokens, 32, 8, gen, remote_fraction=0.875)
    want = nvfp4_fused_moe_reference(x, *layer.args(), w, ids)
    for bk in (64, 128, 256, None):
        cfg = None if bk is None else MoeConfig(*(GemmConfig(16, 64, bk, num_warps=4, num_stages=3),) * 2)
        for chains in (1, 2, 4):
            w4a16_plan.TWO_CHAINS_TOKENS_PER_EXPERT = (0.0, float("inf")) if chains > 1 else None
            w4a16_plan.CHAINS = max(chains, 2)
            w4a16_plan.CHAINS_MULTI_TILE_GEMM2 = True  # H = I = 512: gemm2 may walk several N tiles a program
            try:
                got = fused_moe(x.cuda(), weights, w.cuda(), ids.cuda(), check_ids=False, num_global_experts=256,
                                config=cfg)  # fmt: skip
            except RuntimeError as e:
                print(f"T={tokens} block_k={bk} chains={chains}: refused: {str(e).splitlines()[0][:160]}", flush=True)
                continue
            err = ((got.cpu().double() - want).norm() / want.norm()).item()
            print(f"T={tokens} block_k={bk} chains={chains}: rel err {err:.2e}", flush=True)
