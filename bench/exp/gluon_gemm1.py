"""gemm1 alone: the Gluon form (``variants/w4a16_gluon.py``, ``kernels/nvfp4_moe_gluon.py``) against the op's Triton
gemm1, on the same routing and layer, CUDA graphs of 20 launches, medians of three round-robin rounds.

    STEPS=exp EXP=bench/exp/gluon_gemm1.py bash bench/device_run.sh                  # unsplit, B = 8-256
    EXP_MODE=decode STEPS=exp EXP=bench/exp/gluon_gemm1.py bash bench/device_run.sh  # against the op's plan, B = 1-16
    EXP_MODE=tiles STEPS=exp EXP=bench/exp/gluon_gemm1.py bash bench/device_run.sh   # Gluon tiles, B = 16-256

Unsplit: the Gluon kernel with 0, 1 and 2 quarters of wgmmas in flight against the op's gemm1 with two tiles and a
program per possible block. Decode: the op's gemm1 with its cached tile and planned grid (K splits or stream-K)
against the Gluon kernel split for about 1, 2 and 4 programs per SM by the op's estimate of the blocks, and unsplit.
Writes ``$OUT/gluon_gemm1.json`` or ``gluon_gemm1_decode.json`` (each kernel's median µs, h's relative difference
from the op's on the valid pairs, the touched-experts floor of gemm1's bytes). ``GLUON_PROFILE=1`` launches each
kernel of the first case once and exits, for Nsight Compute (``ncu --set full python3 bench/exp/gluon_gemm1.py OUT``).

This decides whether the Gluon gemm1 (sm_90 only) earns its place: it stays where it beats the Triton gemm1 on the
same tile and split by 5% or more at a shipped bucket (EXP_MODE=decode, B = 1-16; EXP_MODE=tiles, B = 16-256).
"""

import dataclasses
import functools
import json
import os
import statistics
import sys
from pathlib import Path

import decode_cases as dc
import torch
import triton

from sglang_glm5 import bench_real
from sglang_glm5.routing import route_pairs
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16, w4a16_gluon, w4a16_plan

BASELINES = ("16x128x256-w4-s3", "16x64x256-w4-s3")


def gluon_call(args, h, top_k, rows, inter, hidden, splits_want, lookahead, blocks, tile=w4a16_gluon.TILE):
    """The Gluon gemm1 with ``tile`` and ``lookahead`` quarters in flight, K in at most ``splits_want`` splits: a
    callable, and its split count."""
    splits, per_split = w4a16_plan.k_splits(hidden, tile.block_k, splits_want)
    counters = torch.zeros(w4a16_gluon.counters_needed(blocks, inter, tile), dtype=torch.int32, device="cuda")

    def call():
        w4a16_gluon.launch(*args, h, top_k, *rows, splits=splits, k_per_split=per_split, counters=counters,
                           pdl=False, tile=tile, lookahead=lookahead)  # fmt: skip

    return call, splits


def time_case(name, layout, weights, batch, inputs, variants_for, bw) -> dict:
    """Time the variants ``variants_for(args, ids, rows, route)`` returns ({label: (callable, h)}) on the case."""
    x, _, ids = inputs[0]
    xp = torch.empty_like(x)
    each_pair = ids.numel() <= min(w4a16_plan.EACH_PAIR_MAX_PAIRS, layout.num_experts)
    route = route_pairs(ids, layout.num_experts, 16, permute=(x, xp), layout=weights.layout, each_pair=each_pair)
    args = (xp, weights.w13, weights.w13_scale, weights.w13_scale_2, route)
    fns = variants_for(args, ids, weights.gate_up_rows, route)
    if os.environ.get("GLUON_PROFILE") == "1":
        for fn, _h in fns.values():
            fn()
            torch.cuda.synchronize()
        sys.exit(0)
    valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
    outs = {}
    for label, (fn, h) in fns.items():
        fn()
        torch.cuda.synchronize()
        outs[label] = h[valid].float()
    ref = next(iter(outs.values()))
    rel = {k: ((v - ref).norm() / ref.norm()).item() for k, v in outs.items()}
    times = {k: [] for k in fns}
    for _ in range(3):
        for label, (fn, _h) in fns.items():
            times[label].append(bench_real._time(lambda fn=fn: [fn() for _ in range(20)], True, 20))
    touched = int(torch.unique(ids[ids >= 0]).numel())
    floor_us = touched * layout.expert_bytes * 2 / 3 / bw * 1e6
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    first = next(iter(med.values()))
    cells = " | ".join(f"{k} {v:6.1f} ({v / first:.3f}, {rel[k]:.0e})" for k, v in med.items())
    print(f"{name} B={batch:4d} touched {touched:3d} floor {floor_us:6.1f} us | {cells}", flush=True)
    return {"layout": name, "batch": batch, "touched": touched, "gemm1_floor_us": floor_us, "us": med, "rel_diff": rel}


def unsplit_variants(layout):
    def variants(args, ids, rows, route):
        fns = {}
        for label in BASELINES:
            h = torch.zeros((ids.numel(), layout.inter), dtype=torch.bfloat16, device="cuda")
            fns[label] = (functools.partial(w4a16.launch_gemm1, *args, h, GemmConfig.from_label(label), ids.shape[1],
                                            *rows, False, layout="kernel_wgmma"), h)  # fmt: skip
        for lookahead in (1, 0, 2):
            h = torch.zeros((ids.numel(), layout.inter), dtype=torch.bfloat16, device="cuda")
            call, _ = gluon_call(args, h, ids.shape[1], rows, layout.inter, layout.hidden, 1, lookahead,
                                 route.block_expert.numel())  # fmt: skip
            fns[f"gluon-la{lookahead}"] = (call, h)
        return fns

    return variants


def decode_variants(layout, batch, sms, per_sms=(1, 2, 4, 0)):
    def variants(args, ids, rows, route):
        cfg = dc.cached_config(layout, batch)
        num_pairs = ids.numel()
        plan = w4a16_plan.plan_gemms(cfg, num_pairs, layout.num_experts, bench_real.GLOBAL_EXPERTS, layout.hidden,
                                     layout.inter, sms)  # fmt: skip
        h = torch.zeros((num_pairs, layout.inter), dtype=torch.bfloat16, device="cuda")
        counters = torch.zeros(max(plan.counters, 1), dtype=torch.int32, device="cuda")
        fns = {f"op {cfg.gemm1.label}": (functools.partial(
            w4a16.launch_gemm1, *args, h, cfg.gemm1, ids.shape[1], *rows, False, launch=plan.gemm1, counters=counters,
            layout="kernel_wgmma"), h)}  # fmt: skip
        expected = w4a16_plan.expected_blocks(num_pairs, layout.num_experts, bench_real.GLOBAL_EXPERTS, 16)
        tiles = triton.cdiv(layout.inter, w4a16_gluon.TILE.block_n)
        bound = route.block_expert.numel()
        for per_sm in per_sms:  # the op's split plan aimed at per_sm programs an SM; 0: unsplit
            tile = dataclasses.replace(w4a16_gluon.TILE, programs_per_sm=per_sm, split_k=0 if per_sm else 1)
            want = w4a16_plan.plan_launch(layout.hidden, tile, tiles, bound, expected, sms).splits
            hg = torch.zeros((num_pairs, layout.inter), dtype=torch.bfloat16, device="cuda")
            call, splits = gluon_call(args, hg, ids.shape[1], rows, layout.inter, layout.hidden, want,
                                      w4a16_gluon.LOOKAHEAD, route.block_expert.numel())  # fmt: skip
            fns.setdefault(f"gluon-k{splits}", (call, hg))
        return fns

    return variants


# EXP_MODE=tiles: Gluon tiles (label:lookahead) against the op's planned gemm1 at busy decode sizes.
TILES = ("16x64x256-w4-s3:1", "16x64x256-w4-s4:1", "16x64x256-w4-s3:0", "16x128x128-w4-s4:1", "16x128x128-w4-s3:0",
         "16x128x128-w4-s4:0", "16x64x128-w4-s4:1")  # fmt: skip


def tile_variants(layout, batch, sms):
    """The op's gemm1 (cached tile, planned grid) and each of ``EXP_TILES`` (default TILES) split by the op's plan
    for 2 programs per SM (unsplit where the blocks fill the GPU)."""
    labels = os.environ.get("EXP_TILES", ",".join(TILES)).split(",")

    def variants(args, ids, rows, route):
        fns = decode_variants(layout, batch, sms, per_sms=())(args, ids, rows, route)
        num_pairs = ids.numel()
        expected = w4a16_plan.expected_blocks(num_pairs, layout.num_experts, bench_real.GLOBAL_EXPERTS, 16)
        bound = route.block_expert.numel()
        for item in labels:
            label, _, la = item.partition(":")
            tile = dataclasses.replace(GemmConfig.from_label(label), programs_per_sm=2, gluon=True)
            want = w4a16_plan.plan_launch(layout.hidden, tile, triton.cdiv(layout.inter, tile.block_n), bound, expected,
                                          sms).splits  # fmt: skip
            hg = torch.zeros((num_pairs, layout.inter), dtype=torch.bfloat16, device="cuda")
            call, splits = gluon_call(args, hg, ids.shape[1], rows, layout.inter, layout.hidden, want, int(la or 1),
                                      bound, tile)  # fmt: skip
            fns[f"g{label.removeprefix('16x')}-la{la}-k{splits}"] = (call, hg)
        return fns

    return variants


def main(out: Path) -> None:
    mode = os.environ.get("EXP_MODE", "unsplit")
    default = {"decode": "1,2,4,8,16", "tiles": "16,32,64,128,256"}.get(mode, "8,16,32,64,128,256")
    batches = [int(b) for b in os.environ.get("EXP_BATCHES", default).split(",")]
    gen = dc.generator({"decode": 101, "tiles": 103}.get(mode, 97))
    bw = bench_real.copy_bandwidth()
    sms = w4a16_plan.sm_count(torch.cuda.current_device())
    rows = []
    for name, layout, bundles, batch, inputs in dc.cases(gen, batches):
        if mode == "decode":
            variants = decode_variants(layout, batch, sms)
        elif mode == "tiles":
            variants = tile_variants(layout, batch, sms)
        else:
            variants = unsplit_variants(layout)
        rows.append(time_case(name, layout, bundles[0], batch, inputs, variants, bw))
    name = {"decode": "gluon_gemm1_decode", "tiles": "gluon_gemm1_tiles"}.get(mode, "gluon_gemm1")
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
