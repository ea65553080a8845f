"""Experiment: W4A16 tiles for chunked-prefill sizes (B = 8192 tokens: 256 tokens per expert), against the dense
prefill path and bf16 ``_grouped_mm`` in the same run.

With 256 tokens per expert the layer is compute-bound (EP8: 618 GFLOP for 600 MB of NVFP4 weights). The dense path
dequantizes every weight to bf16 first (2.4 GB written, 0.6 ms at the copy bandwidth) and then runs the bf16 GEMMs,
so it cannot come within 1.25x of bf16 alone; a W4A16 kernel decodes each weight tile once per block of pairs, and
with 128-256 pairs per block that decode is a small part of the tensor cores' time. This times, eagerly, on one
real routing per layout (weights far larger than L2):

1. bf16 ``_grouped_mm`` on the same slots (pre-sorted), the dense path, and the W4A16 op with the tiles a lookup
   picks now (``cached``);
2. the W4A16 op with one GEMM's tile replaced by each candidate (``G1`` / ``G2``), the other as cached;
3. the fastest gemm1 and gemm2 together, against the three of step 1 again, ``REPEATS`` times round-robin.

Each op's output is compared with the cached tiles' (max relative difference) and, for the combination, with the
bf16 path's (relative Frobenius error).
Usage: python bench/exp/prefill_tiles.py OUT_DIR   (EXP_BATCHES, default 8192; EXP_G1, EXP_G2: comma-separated tiles,
empty for none; EXP_LAYOUTS, default ep8,tp8; EXP_REPEATS, rounds of step 3, default 3)
"""

import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cached_config, generator, kernel_us

from sglang_glm5 import bench_real, prefill
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8192").split(","))
REPEATS = int(os.environ.get("EXP_REPEATS", "3"))
G1 = tuple(t for t in os.environ.get("EXP_G1", ",".join((
    "128x128x64-w8-s3", "128x128x64-w8-s4", "128x128x128-w8-s2", "64x128x128-w8-s3", "128x64x128-w4-s3",
    "128x64x64-w4-s4", "256x64x64-w8-s3", "256x128x64-w8-s3",
))).split(",") if t)  # fmt: skip
G2 = tuple(t for t in os.environ.get("EXP_G2", ",".join((
    "128x128x64-w8-s4", "128x128x128-w8-s4", "256x128x64-w8-s3", "256x128x128-w8-s2", "128x256x64-w8-s3",
    "256x64x128-w4-s3",
))).split(",") if t)  # fmt: skip
LAYOUTS = tuple(t for t in os.environ.get("EXP_LAYOUTS", "ep8,tp8").split(",") if t)


def ms(fn) -> float:
    return bench_real._time(fn, False, 1)


def run_layout(name: str, gen: torch.Generator, bw: float) -> list[dict]:
    layout = bench_real.LAYOUTS[name]
    layer = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda")
    bundle = layer.served()
    w13_t, w2_t = (w.contiguous() for w in bench_real.dequantize_bf16(layer, layout.num_experts, layout.inter))
    rows = []
    for batch in BATCHES:
        weights, ids = bench_real.real_routing(batch, layout, gen)
        x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
        xs, offs, order = bench_real.sorted_slots(x, ids, layout.num_experts)
        cached = cached_config(layout, batch)

        def op(config, x=x, weights=weights, ids=ids):
            return fused_moe(x, bundle, weights, ids, config=config, path="w4a16", **OP_KWARGS)

        def bf16(xs=xs, offs=offs):
            return bench_real.grouped_mm_moe(xs, w13_t, w2_t, offs, layout.inter)

        def dense(x=x, weights=weights, ids=ids):
            return fused_moe(x, bundle, weights, ids, path="dense", **OP_KWARGS)

        fixed = {"bf16": bf16, "dense": dense, "cached": lambda c=cached: op(c)}
        t = {k: ms(f) for k, f in fixed.items()}
        t["dequant w13"] = ms(lambda: prefill.dequantize_bf16(bundle.w13, bundle.w13_scale, layout=bundle.layout))
        t["dequant w2"] = ms(lambda: prefill.dequantize_bf16(bundle.w2, bundle.w2_scale, layout=bundle.layout))
        ref = op(cached).float()
        print(f"{name} B={batch} cached {cached}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in t.items()), flush=True)
        trials = {}
        for gemm, labels in (("gemm1", G1), ("gemm2", G2)):
            for label in labels:
                cfg = dataclasses.replace(cached, **{gemm: GemmConfig.from_label(label)})
                try:
                    got = op(cfg).float()
                    tm = ms(lambda c=cfg: op(c))
                except Exception as e:  # noqa: BLE001 - an out-of-resources launch is a result here
                    print(f"  {gemm} {label}: failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                diff = float((got - ref).abs().max() / ref.abs().max())
                trials[f"{gemm} {label}"] = {"ms": tm, "rel_diff": diff}
                print(f"  {gemm} {label:20s} {tm:.3f} ms ({tm / t['cached']:.3f} x cached, "
                      f"{tm / t['bf16']:.2f} x bf16) rel diff {diff:.1e}", flush=True)  # fmt: skip
        best = {}
        for gemm in ("gemm1", "gemm2"):
            mine = {k.split()[1]: v["ms"] for k, v in trials.items() if k.startswith(gemm)}
            if mine and min(mine.values()) < t["cached"]:
                best[gemm] = GemmConfig.from_label(min(mine, key=mine.get))
        combo = dataclasses.replace(cached, **best)
        fixed["combo"] = lambda c=combo: op(c)
        rounds = {k: [] for k in fixed}
        for _ in range(REPEATS):
            for k, f in fixed.items():
                rounds[k].append(ms(f))
        bref = bench_real.slot_sum(bf16(), order, weights, batch)
        err = float((op(combo).float() - bref).norm() / bref.norm())
        kernels = {k: kernel_us(fixed[k], 1) for k in ("cached", "combo")}
        med = {k: statistics.median(v) for k, v in rounds.items()}
        rows.append({"layout": name, "batch": batch, "cached": str(cached), "combo": str(combo), "single": t,
                     "trials": trials, "rounds_ms": rounds, "median_ms": med, "combo_rel_err_vs_bf16": err,
                     "kernels_us": kernels, "copy_bandwidth": bw})  # fmt: skip
        print(f"{name} B={batch} combo {combo}: rel err vs bf16 {err:.1e}", flush=True)
        for k, v in med.items():
            print(f"  {k:7s} {v:.3f} ms ({v / med['bf16']:.2f} x bf16) rounds {[round(r, 3) for r in rounds[k]]}")
        for k, ks in kernels.items():
            print(f"  kernels {k}: " + " ".join(f"{n} {u:.0f} us" for n, u in sorted(ks.items())), flush=True)
    return rows


def main(out: Path) -> None:
    gen = generator(17)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name in LAYOUTS:
        rows += run_layout(name, gen, bw)
        torch.cuda.empty_cache()
    (out / "prefill_tiles.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
