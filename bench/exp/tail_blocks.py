"""Experiment: what each expert's last, partly filled routing block costs at chunked-prefill sizes.

At GLM-5 B = 8192 an expert gets about 253 pairs: with blocks of 128 pairs that is two full blocks or, for about
half the experts, a third one holding a few pairs, and the GEMMs spend as much on that block as on a full one.
This splits one real routing in two: each expert's first floor(count / BLOCK_M) * BLOCK_M pairs ("full", the other
slots -1) and the rest ("tail"), and times the op from CUDA graphs on all of it with the cached tiles, on the full
part with the same tiles, and on the tail part with smaller tiles (those the cache holds for fewer tokens per
expert). The per-kernel times say what two GEMM launches (full blocks, then narrow tail blocks) would take against
one. The two parts' outputs add up to the whole's (checked).
Usage: python bench/exp/tail_blocks.py OUT_DIR   (EXP_BATCHES, default 2048,8192; EXP_LAYOUTS, default ep8,tp8;
EXP_TAIL_BATCHES: the B whose cached tiles the tail tries, default 256,512,1024,2048)
"""

import json
import os
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cached_config, generator, kernel_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "2048,8192").split(","))
LAYOUTS = tuple(t for t in os.environ.get("EXP_LAYOUTS", "ep8,tp8").split(",") if t)
TAIL_BATCHES = tuple(int(b) for b in os.environ.get("EXP_TAIL_BATCHES", "256,512,1024,2048").split(","))


def split_full_tail(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids with only each expert's first floor(count / block_m) * block_m pairs, in pair order; ids with the rest),
    other slots -1."""
    flat = ids.reshape(-1).long()
    valid = flat >= 0
    key = torch.where(valid, flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(flat[valid], minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device)
    rank = rank - starts[key.clamp(max=num_experts - 1)]
    full = valid & (rank < (counts // block_m * block_m)[key.clamp(max=num_experts - 1)])
    tail = valid & ~full
    minus = torch.full_like(flat, -1)
    return (torch.where(full, flat, minus).to(ids.dtype).reshape(ids.shape),
            torch.where(tail, flat, minus).to(ids.dtype).reshape(ids.shape))  # fmt: skip


def blocks(ids: torch.Tensor, num_experts: int, block_m: int) -> int:
    flat = ids.reshape(-1).long()
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    return int(((counts + block_m - 1) // block_m).sum())


def gemms(kernels: dict[str, float]) -> float:
    return sum(v for k, v in kernels.items() if k in ("gemm1", "gemm2"))


def main(out: Path) -> None:
    gen = generator(43)
    rows = []
    for name in LAYOUTS:
        layout = bench_real.LAYOUTS[name]
        bundle = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served()
        for batch in BATCHES:
            weights, ids = bench_real.real_routing(batch, layout, gen)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            cached = cached_config(layout, batch)
            bm = cached.gemm1.block_m
            ids_full, ids_tail = split_full_tail(ids, layout.num_experts, bm)

            def op(cfg, which, x=x, weights=weights, bundle=bundle):
                return fused_moe(x, bundle, weights, which, config=cfg, path="w4a16", **OP_KWARGS)

            whole = op(cached, ids).float()
            variants = {"all": (cached, ids), "full": (cached, ids_full)}
            for tb in TAIL_BATCHES:
                variants[f"tail@{tb}"] = (cached_config(layout, tb), ids_tail)
            row = {"layout": name, "batch": batch, "cached": str(cached), "slots": int((ids >= 0).sum()),
                   "tail_slots": int((ids_tail >= 0).sum()), "variants": {}}  # fmt: skip
            full_out = op(cached, ids_full).float()
            print(f"{name} B={batch} cached {cached}: {row['slots']} slots, {row['tail_slots']} in tails; blocks of "
                  f"{bm}: all {blocks(ids, layout.num_experts, bm)}, full {blocks(ids_full, layout.num_experts, bm)}",
                  flush=True)  # fmt: skip
            for v, (cfg, which) in variants.items():
                ms = bench_real._time(lambda cfg=cfg, which=which: op(cfg, which), True, 1)
                ks = kernel_us(lambda cfg=cfg, which=which: op(cfg, which), 1)
                entry = {"config": str(cfg), "ms": ms, "kernels_us": ks, "gemms_us": gemms(ks)}
                if v.startswith("tail"):
                    added = full_out + op(cfg, which).float()
                    entry["rel_diff_sum_vs_whole"] = float((added - whole).norm() / whole.norm())
                    entry["tail_blocks"] = blocks(which, layout.num_experts, cfg.gemm1.block_m)
                row["variants"][v] = entry
                print(f"  {v:10s} {ms:.3f} ms gemms {gemms(ks):7.1f} us | " + " ".join(
                    f"{k} {t:.0f}" for k, t in sorted(ks.items())) + f" | {cfg}" + (
                    f" | sum rel diff {entry['rel_diff_sum_vs_whole']:.1e}, {entry['tail_blocks']} blocks"
                    if "tail_blocks" in entry else ""), flush=True)  # fmt: skip
            best = min((v for v in row["variants"] if v.startswith("tail")),
                       key=lambda v: row["variants"][v]["gemms_us"])  # fmt: skip
            split_us = row["variants"]["full"]["gemms_us"] + row["variants"][best]["gemms_us"]
            all_us = row["variants"]["all"]["gemms_us"]
            row["split_gemms_us"], row["best_tail"] = split_us, best
            print(
                f"  GEMMs: one launch each {all_us:.0f} us, full + {best} {split_us:.0f} us ({split_us / all_us:.3f}x)",
                flush=True,
            )
            rows.append(row)
        torch.cuda.empty_cache()
    (out / "tail_blocks.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
