"""Experiment: what the routing launch costs the op at decode, as a bound on folding it into the GEMMs.

For EP8 and TP8 at EXP_BATCHES (default 1,2,4,8), the op from a CUDA graph over 16 real routings (decode_cases),
round-robin twice: "op" as shipped; "no-route" with the routing launch taken out of the graph (each call's blocks
computed before capture, the activations not laid out, the split-K counters not zeroed: the GEMMs then compute
garbage, and a program may skip the split reduction, so this is a lower bound on an op without that launch);
"no-route+zero" the same with the counters zeroed by a memset node. Medians in microseconds and ratios to "op".
Usage: python bench/exp/no_route.py OUT_DIR
"""

import json
import os
import statistics
import sys
from pathlib import Path

from decode_cases import OP_KWARGS, cases, floor_ms, generator

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8").split(","))
SHIPPED = w4a16.route_pairs


def main(out: Path) -> None:
    gen = generator(3)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        routes = {}

        def precomputed(
            topk_ids, num_experts, block_m, zero=None, permute=None, *, pdl=False, layout="checkpoint",
            each_pair=False, memset=False, routes=routes,
        ):  # fmt: skip
            key = (topk_ids.data_ptr(), block_m)
            if key not in routes:
                routes[key] = SHIPPED(topk_ids, num_experts, block_m, zero=zero, permute=permute, layout=layout,
                                       each_pair=each_pair)  # fmt: skip
            if memset and zero is not None:
                zero.zero_()
            return routes[key]

        def call(inputs=inputs, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS)

        variants = {
            "op": SHIPPED,
            "no-route": precomputed,
            "no-route+zero": lambda *a, **k: precomputed(*a, memset=True, **k),
        }
        times = {v: [] for v in variants}
        for _ in range(2):
            for variant, route in variants.items():
                w4a16.route_pairs = route
                call()  # eager: fills the precomputed routes before the capture
                times[variant].append(bench_real._time(call, True, len(inputs)))
        w4a16.route_pairs = SHIPPED
        med = {v: statistics.median(t) for v, t in times.items()}
        row = {"layout": name, "batch": batch, "floor_ms": floor_ms(inputs, layout, bw), "ms": times}
        rows.append(row)
        cols = "  ".join(f"{v} {med[v] * 1e3:6.2f} us ({med[v] / med['op']:.3f})" for v in variants)
        print(f"{name} B={batch:3d} floor {row['floor_ms'] * 1e3:5.1f} us | {cols}", flush=True)
    (out / "no_route.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
