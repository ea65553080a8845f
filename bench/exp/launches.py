"""Experiment: programmatic dependent launch (PDL) for the W4A16 op's launches at decode, and for which ones
(EXP_SET=pdl), or the programs per SM of the split-K plan (EXP_SET=pps); EXP_BATCHES the B to time.

For EP8 and TP8 (sglang_glm5.bench_real layouts, the layer as the plugin keeps it), B = 1 .. 256 tokens
per step, the op from a CUDA graph over 16 routings in each variant below, round-robin twice on the same
inputs; the median of each, its ratio to the first variant, and whether it gives the first variant's bits.
Usage: python bench/exp/launches.py OUT_DIR
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cases, floor_ms, generator

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64").split(","))
# name: (SGLANG_GLM5_PDL, w4a16_plan.PDL_LAUNCHES, w4a16_plan.PROGRAMS_PER_SM); EXP_SET picks a set. Run 21's set
# "prefetch" (the GEMMs' L2 prefetch before their wait, w4a16.PREFETCH_LAUNCHES) ran on commit 9df2ba6, which has that
# code.
ALL = ("route", "gemm1", "gemm2", "sum")
SETS = {
    "pdl": {  # which launches use PDL (run 20)
        "plain": ("0", ALL, 2),
        "pdl": ("1", ALL, 2),
        "pdl-no-gemm1": ("1", ("route", "gemm2", "sum"), 2),
        "pdl-no-gemm2": ("1", ("route", "gemm1", "sum"), 2),
    },
    "pps": {  # programs per SM that the split-K plan aims for (run 21)
        "pps2": ("1", ALL, 2),
        "pps1": ("1", ALL, 1),
        "pps3": ("1", ALL, 3),
        "pps4": ("1", ALL, 4),
    },
}
VARIANTS = SETS[os.environ.get("EXP_SET", "pdl")]


def main(out: Path) -> None:
    gen = generator(3)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        kw = OP_KWARGS

        def call(inputs=inputs, kw=kw, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, **kw)

        times = {v: [] for v in VARIANTS}
        outs = {}
        for _ in range(2):
            for variant, (pdl, launches, pps) in VARIANTS.items():
                os.environ["SGLANG_GLM5_PDL"] = pdl
                w4a16_plan.PDL_LAUNCHES = launches
                w4a16_plan.PROGRAMS_PER_SM = pps
                times[variant].append(bench_real._time(call, True, len(inputs)))
                x, w, ids = inputs[0]
                outs[variant] = fused_moe(x, bundles[0], w, ids, **kw)
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        first = next(iter(VARIANTS))
        row = {"layout": name, "batch": batch, "floor_ms": floor, "ms": times,
               "same_bits": {v: bool(torch.equal(outs[v], outs[first])) for v in VARIANTS}}  # fmt: skip
        rows.append(row)
        cols = "  ".join(f"{v} {med[v] * 1e3:7.2f} us ({med[v] / med[first]:.3f})" for v in VARIANTS)
        same = ",".join(v for v, s in row["same_bits"].items() if s)
        print(f"{name} B={batch:4d} floor {floor * 1e3:6.1f} us | {cols} | same bits: {same}", flush=True)
    os.environ.pop("SGLANG_GLM5_PDL", None)
    w4a16_plan.PDL_LAUNCHES = ALL
    w4a16_plan.PROGRAMS_PER_SM = 2
    (out / f"launches_{os.environ.get('EXP_SET', 'pdl')}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
