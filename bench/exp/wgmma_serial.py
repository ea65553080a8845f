"""Experiment: the K loops with ``tl.assume(K > 0)`` (current kernels) against the same kernels without it.

Without the hint the compiled loop has a zero-trip path on which the accumulators are set by plain
moves while the loop's last wgmma group may still be in flight; ptxas then serializes every wgmma
(warning C7515). Each GEMM alone over a few tiles per m, both variants interleaved, then the whole op
with the shipped cache. Writes wgmma_serial.json into the folder given as the first argument.
"""

import importlib.util
import inspect
import json
import os
import sys
import tempfile
from functools import partial

import torch
import triton
import triton.testing

from sglang_glm5 import moe, routing
from sglang_glm5.bench import balanced_routing
from sglang_glm5.kernels import nvfp4_moe
from sglang_glm5.shapes import parse_shape
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."


def _without_assume():
    src = inspect.getsource(nvfp4_moe)
    stripped = "\n".join(line for line in src.splitlines() if "tl.assume(" not in line)
    assert stripped != src, "the kernels have no tl.assume: nothing to compare"
    path = os.path.join(tempfile.mkdtemp(), "nvfp4_moe_no_assume.py")
    with open(path, "w") as f:
        f.write(stripped + "\n")
    spec = importlib.util.spec_from_file_location("nvfp4_moe_no_assume", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


VARIANTS = {"assume": nvfp4_moe, "no_assume": _without_assume()}
TILES = {
    "gemm1": {
        1: [(16, 128, 256, 4, 3), (16, 128, 256, 4, 4), (16, 64, 256, 4, 3), (16, 128, 128, 4, 4)],
        16: [(16, 128, 256, 4, 3), (16, 128, 256, 4, 4), (16, 64, 256, 4, 3), (16, 128, 128, 4, 4)],
        32: [(32, 128, 256, 4, 3), (32, 128, 256, 8, 3), (32, 128, 128, 4, 4), (32, 64, 256, 4, 3)],
        64: [(64, 128, 256, 8, 3), (64, 128, 128, 8, 3), (64, 128, 128, 8, 4), (64, 64, 256, 4, 3)],
    },
    "gemm2": {
        1: [(16, 64, 256, 4, 3), (16, 128, 256, 8, 3), (16, 64, 256, 4, 4), (16, 128, 256, 4, 3)],
        16: [(16, 64, 256, 4, 3), (16, 128, 256, 8, 3), (16, 64, 256, 4, 4), (16, 128, 256, 4, 3)],
        32: [(32, 128, 128, 8, 3), (32, 64, 256, 4, 3), (32, 128, 256, 8, 3), (32, 64, 128, 4, 4)],
        64: [(64, 128, 128, 8, 3), (64, 128, 256, 8, 3), (64, 64, 128, 4, 4), (64, 128, 128, 8, 4)],
    },
}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


shape = parse_shape("glm5-ep8")
gen = torch.Generator(device="cuda")
gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
w13, s13, g13, w2, s2, g2 = layer.args()[:6]
rows = []
triton.testing.do_bench(lambda: torch.empty(1 << 28, device="cuda").fill_(1.0), warmup=1000, rep=10)  # clocks up
for m in (1, 16, 32, 64):
    weights, ids, tokens = balanced_routing(shape, m, gen)
    x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
    xp = routing.prepare_activations(x)
    P = ids.numel()
    for gemm in ("gemm1", "gemm2"):
        for t in TILES[gemm][m]:
            cfg = GemmConfig(*t)
            route = routing.route_pairs(ids, shape.num_experts, cfg.block_m)
            outs, times = {}, {}
            h = (torch.randn(P, shape.inter, generator=gen, device="cuda") * 0.1).bfloat16()  # gemm2's input
            for name, mod in VARIANTS.items():
                w4a16._k = mod
                if gemm == "gemm1":
                    res = torch.empty(P, shape.inter, dtype=x.dtype, device="cuda")
                    fn = partial(w4a16.launch_gemm1, xp, w13, s13, g13, route, res, cfg, shape.top_k, 0, shape.inter,
                                 False)  # fmt: skip
                else:
                    res = torch.empty(P, shape.hidden, dtype=x.dtype, device="cuda")
                    fn = partial(w4a16.launch_gemm2, h, w2, s2, g2, weights.reshape(-1), route, res, cfg, False)
                try:
                    fn()
                    torch.cuda.synchronize()
                    outs[name] = res.clone()
                    times[name] = bench(fn)
                except Exception as e:  # a tile that does not compile or launch on this GPU
                    times[name] = None
                    print(m, gemm, cfg.label, name, "failed:", str(e).splitlines()[0][:200], flush=True)
            w4a16._k = nvfp4_moe
            same = len(outs) == 2 and torch.equal(outs["assume"], outs["no_assume"])
            row = dict(m=m, gemm=gemm, cfg=cfg.label, **{f"ms_{k}": v for k, v in times.items()}, identical=same)
            rows.append(row)
            print(row, flush=True)
    # the whole op with the shipped cache, both variants
    args = (x, *layer.args(), weights, ids)
    for name, mod in VARIANTS.items():
        w4a16._k = mod
        t_op = bench(partial(moe.nvfp4_fused_moe, *args, check_ids=False))
        rows.append(dict(m=m, gemm="op", cfg="cache", variant=name, ms=t_op))
        print(rows[-1], flush=True)
    w4a16._k = nvfp4_moe
json.dump(rows, open(os.path.join(out_dir, "wgmma_serial.json"), "w"), indent=1)
