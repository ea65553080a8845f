"""Time nvfp4_fused_moe over a grid of tile configs on the local GPU (the data behind the heuristic).

python bench/sweep_configs.py --shape glm5-ep8 --m 1,16,64,256,2048 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from functools import partial

import torch
import triton
import triton.testing

from sglang_glm5.bench import balanced_routing, copy_bandwidth, environment
from sglang_glm5.moe import nvfp4_fused_moe
from sglang_glm5.routing import align_pairs_by_expert
from sglang_glm5.shapes import parse_shape
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16


def candidates(m: int) -> list[GemmConfig]:
    """Tiles for the swapped GEMMs (weights [BLOCK_N, BLOCK_K] as the left operand, BLOCK_M pairs)."""
    if m <= 16:
        space = itertools.product((16,), (64, 128), (128, 256, 512), (2, 3, 4), (4, 8))
    elif m <= 64:
        space = itertools.product((16, 32, 64), (64, 128), (128, 256), (3, 4), (4, 8))
    else:
        space = itertools.product((64, 128), (64, 128), (64, 128), (3, 4), (4, 8))
    # One warpgroup per 64 weight rows: 8 warps only for BLOCK_N = 128.
    return [GemmConfig(bm, bn, bk, w, st) for bm, bn, bk, st, w in space if w == 4 or bn == 128]


def breakdown(shape, args, cfg: GemmConfig) -> dict[str, float]:
    """Median ms of each stage of the op with one config: routing sort, gemm1, gemm2, top-k sum."""
    from sglang_glm5 import routing

    x, w13, s13, g13, w2, s2, g2, weights, ids = args
    inter = shape.inter
    num_pairs = ids.numel()
    route = routing.route_pairs(ids, shape.num_experts, cfg.block_m)
    xp = routing.prepare_activations(x)
    h = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(num_pairs, shape.hidden, dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    stages = {
        "align": partial(routing.route_pairs, ids, shape.num_experts, cfg.block_m),
        "prepare": partial(routing.prepare_activations, x),
        "gemm1": partial(w4a16.launch_gemm1, xp, w13, s13, g13, route, h, cfg, shape.top_k, 0, inter, False),
        "gemm2": partial(w4a16.launch_gemm2, h, w2, s2, g2, weights.reshape(-1), route, y, cfg, False),
        "sum": partial(routing.sum_over_slots, y, ids, out, shape.num_experts, False),
    }  # fmt: skip
    return {name: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") for name, fn in stages.items()}


def dense_ms(args) -> float | None:
    """Median ms of the dense prefill path (sglang_glm5.prefill) forced on, where the GPU has it."""
    from sglang_glm5 import prefill

    if not prefill.available(args[0].device):
        return None
    old = os.environ.get(prefill.ENV_MIN_TOKENS)
    os.environ[prefill.ENV_MIN_TOKENS] = "0"
    try:
        return triton.testing.do_bench(partial(nvfp4_fused_moe, *args, check_ids=False), warmup=5, rep=40,
                                       return_mode="median")  # fmt: skip
    finally:
        if old is None:
            del os.environ[prefill.ENV_MIN_TOKENS]
        else:
            os.environ[prefill.ENV_MIN_TOKENS] = old


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="glm5-ep8")
    p.add_argument("--m", default="1,16,64,256,2048")
    p.add_argument("--out", default=".")
    p.add_argument(
        "--budget-s", type=float, default=400.0, help="sweep time in seconds, split evenly over the m values"
    )
    a = p.parse_args()
    shape = parse_shape(a.shape)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    bw = copy_bandwidth()
    floor = shape.weight_bytes / bw * 1e3
    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
    results = {"environment": environment(), "copy_GBps": bw / 1e9, "floor_ms": floor, "shape": str(shape), "m": {}}
    print(f"{shape}: floor {floor:.3f} ms at {bw / 1e9:.0f} GB/s", flush=True)
    m_values = [int(v) for v in a.m.split(",")]
    for m in m_values:
        t_m = time.time()
        weights, ids, tokens = balanced_routing(shape, m, gen)
        x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
        args = (x, *layer.args(), weights, ids)
        t_align = triton.testing.do_bench(
            partial(align_pairs_by_expert, ids, shape.num_experts, 16), warmup=10, rep=50, return_mode="median"
        )
        ref = nvfp4_fused_moe(*args).float()
        t_dense = dense_ms(args)
        if t_dense is not None:
            print(f"m={m}: dense prefill path {t_dense:.3f} ms ({t_dense / floor:.2f}x floor)", flush=True)
        rows = []
        for cfg in candidates(m):
            if time.time() - t_m > a.budget_s / len(m_values):
                print("  budget spent, stopping the sweep", flush=True)
                break
            mc = MoeConfig(cfg, cfg)
            try:
                out = nvfp4_fused_moe(*args, config=mc).float()
                call = partial(nvfp4_fused_moe, *args, config=mc, check_ids=False)
                ms = triton.testing.do_bench(call, warmup=5, rep=40, return_mode="median")
            except Exception as e:  # out of resources: report and go on
                print(f"  {cfg}: failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            err = ((out - ref).norm() / ref.norm()).item()
            rows.append({**cfg.as_dict(), "ms": ms, "rel_vs_default": err})
        rows.sort(key=lambda r: r["ms"])
        results["m"][m] = {"align_ms": t_align, "dense_ms": t_dense, "configs": rows}
        print(f"m={m} T={tokens}: align {t_align:.3f} ms; best of {len(rows)}:", flush=True)
        for r in rows[:5]:
            print(f"  {r}  ({r['ms'] / floor:.2f}x floor)", flush=True)
        if rows:
            best = GemmConfig(**{k: rows[0][k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")})
            parts = breakdown(shape, args, best)
            results["m"][m]["breakdown_ms"] = parts
            print("  breakdown of the best: " + ", ".join(f"{k} {v:.3f} ms" for k, v in parts.items()), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
