"""Experiment: the Gluon gemm1 alone at chunked-prefill sizes (B = 4096, 8192), forms of its schedule against each
other and against the Triton gemm1 with the same tile, on one real routing per layout.

Forms: the tile (BLOCK_K 128 or 256, 2-4 stages, either order of the wgmmas), LOOKAHEAD, the quarters of wgmmas left in
flight while the next is decoded (the decode tiles use 1), and the grid's order: blocks first (as the op launches it: at
EP8 B = 8192 the 132 programs in flight span most blocks of one N tile, so every N tile reads the activations again from
DRAM) or N tiles first (a block's 16 N tiles side by side, its activation rows read once). Each form's h is compared
with the first form's (max relative difference: a deeper K step sums K in another order, the same tile with another
lookahead or grid order gives the same bits). Times are medians of CUDA-event timings of REPEATS launches, round-robin
over the forms; TFLOP/s counts the pairs' real work (2 * P * 2I * H).
Usage: python bench/exp/prefill_gluon.py OUT_DIR   (EXP_BATCHES, default 4096,8192; PROFILE=1: each layout's first
form once at the last batch, for Nsight Compute)
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import generator

from sglang_glm5 import bench_real, routing
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16, w4a16_gluon

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "4096,8192").split(","))
PROFILE = os.environ.get("PROFILE") == "1"
REPEATS = 9
# (tile, lookahead, blocks last: the grid's N tiles first); a tile without "-gl" runs the Triton gemm1
FORMS = {
    "ep8": [("128x128x128-w8-s3-gl-gu", 1, False), ("128x128x128-w8-s3", 1, False),
            ("128x128x128-w8-s3-gl-gu", 1, True), ("128x128x128-w8-s3-gl-gu", 0, False),
            ("128x128x128-w8-s3-gl-gu", 2, False), ("128x128x128-w8-s3-gl", 2, False),
            ("128x128x128-w8-s2-gl-gu", 1, False), ("128x128x128-w8-s4-gl-gu", 1, True),
            ("128x128x256-w8-s2-gl-gu", 1, False), ("128x128x256-w8-s2-gl-gu", 1, True),
            ("128x128x256-w8-s2-gl-gu", 2, True)],
    "tp8": [("64x128x256-w8-s3-gl", 1, False), ("64x128x256-w8-s3", 1, False), ("64x128x256-w8-s3-gl", 1, True),
            ("64x128x256-w8-s3-gl", 0, False), ("64x128x256-w8-s3-gl", 2, False),
            ("128x128x128-w8-s3-gl-gu", 1, False), ("128x128x128-w8-s3-gl-gu", 1, True),
            ("128x128x256-w8-s2-gl-gu", 1, True)],
}  # fmt: skip


def launcher(layout, bundle, x, ids, label: str, lookahead: int, blocks_last: bool):
    """A closure launching gemm1 alone with ``label``'s tile into its own h, on routing prepared once."""
    tile = GemmConfig.from_label(label)
    xp = torch.empty_like(x)
    route = routing.route_pairs(ids, layout.num_experts, tile.block_m, permute=(x, xp), layout=bundle.layout)
    h = torch.empty(ids.numel(), layout.inter, dtype=torch.bfloat16, device="cuda")
    args = (xp, bundle.w13, bundle.w13_scale, bundle.w13_scale_2, route)
    top_k = ids.shape[1]

    def run():
        if tile.gluon:
            w4a16_gluon.launch(*args, h, top_k, *bundle.gate_up_rows, splits=1, k_per_split=layout.hidden,
                               counters=None, pdl=False, tile=tile, lookahead=lookahead,
                               blocks_last=blocks_last)  # fmt: skip
        else:
            w4a16.launch_gemm1(*args, h, tile, top_k, *bundle.gate_up_rows, False, layout=bundle.layout)
        return h

    return run


def event_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main(out: Path) -> None:
    gen = generator(29)
    rows = []
    for name, forms in FORMS.items():
        layout = bench_real.LAYOUTS[name]
        bundle = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served()
        for batch in BATCHES[-1:] if PROFILE else BATCHES:
            _, ids = bench_real.real_routing(batch, layout, gen)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
            flop = 2 * valid.numel() * 2 * layout.inter * layout.hidden
            runs = {f: launcher(layout, bundle, x, ids, *f) for f in (forms[:1] if PROFILE else forms)}
            if PROFILE:
                next(iter(runs.values()))()
                torch.cuda.synchronize()
                continue
            ref = next(iter(runs.values()))()[valid].float().clone()
            diffs = {}
            for f, run in runs.items():
                got = run()[valid].float()
                diffs[f] = float((got - ref).abs().max() / ref.abs().max())
                run()
            times = {f: [] for f in runs}
            for _ in range(REPEATS):
                for f, run in runs.items():
                    times[f].append(event_ms(run))
            base = statistics.median(times[forms[0]])
            for f in runs:
                ms = statistics.median(times[f])
                row = {"layout": name, "batch": batch, "tile": f[0], "lookahead": f[1], "blocks_last": f[2],
                       "ms": ms, "vs_first": ms / base, "tflops": flop / ms / 1e9, "rel_diff": diffs[f],
                       "times": times[f]}  # fmt: skip
                rows.append(row)
                print(f"{name} B={batch} {f[0]:26s} la={f[1]} blocks_last={int(f[2])} {ms:.3f} ms ({ms / base:.3f}x) "
                      f"{row['tflops']:.0f} TFLOP/s rel diff {diffs[f]:.1e}", flush=True)  # fmt: skip
        del bundle
        torch.cuda.empty_cache()
    if not PROFILE:
        (out / "prefill_gluon.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
