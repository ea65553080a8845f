"""Check: SGLang's order of work at the chained sizes, in a fresh process. For each batch size from 16 down to 4 (an
EP8-like rank: 32 of 256 experts, top-8, I = 1280 so that gemm2 walks one N tile a program), two eager calls, then a
CUDA-graph capture and a replay: the capture must find the chains' kernels loaded by the eager calls (it cannot load
one), and its replay must give the eager calls' bits. Several of these sizes share a plan (``w4a16._eager_key``).
Usage: python bench/exp/eager_capture.py OUT_DIR   (EXP_EAGER_CHAINS=1: the chains in every eager call)"""

import json
import os
import sys
from pathlib import Path

import torch

from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.variants import w4a16_plan
from sglang_glm5.weights import Nvfp4MoeWeights

w4a16_plan.EAGER_CHAINS = os.environ.get("EXP_EAGER_CHAINS", "0") == "1"
gen = torch.Generator().manual_seed(11)
layer = random_layer(32, 512, 1280, gen)
weights = Nvfp4MoeWeights.build(*(a.cuda() for a in layer.args())).for_device()
kwargs = {"check_ids": False, "num_global_experts": 256}
rows = []
for batch in range(16, 3, -1):
    w, ids = random_routing(batch, 32, 8, gen, remote_fraction=0.875)
    args = (torch.randn(batch, 512, generator=gen).bfloat16().cuda(), weights, w.cuda(), ids.cuda())
    eager = [fused_moe(*args, **kwargs) for _ in range(2)]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fused_moe(*args, **kwargs)
        graph.replay()
        torch.cuda.synchronize()
        result = "captured, same bits" if all(torch.equal(out, e) for e in eager) else "captured, other bits"
    except RuntimeError as err:
        result = f"capture failed: {str(err).splitlines()[0][:120]}"
    rows.append({"batch": batch, "result": result})
    print(f"B={batch:2d} {result}", flush=True)
Path(sys.argv[1], "eager_capture.json").write_text(json.dumps(rows, indent=1) + "\n")
