"""Experiment: more programs per SM for gemm1 by capping its registers (Triton's ``maxnreg`` launch option).

gemm1's decode tiles take 198-255 registers a thread, which leaves 2 programs of 4 warps per SM; Nsight Compute
at B = 1 (run 23) found 1.9 active warps per scheduler, 0.43 of them eligible, 21-29% of the issue slots busy.
A cap of 168 registers lets 3 programs in where shared memory allows (16x64x256-w4-s3: 3), 128 lets 4 (if ptxas
can do without spilling much). For EP8 and TP8 at EXP_BATCHES, the op from a CUDA graph over 16 real routings
(decode_cases), round-robin twice: as shipped, then gemm1 launched with each cap; medians, ratios to the shipped
op, and whether the output is bit-identical to it (it should be: the same instructions, other registers).
Usage: python bench/exp/maxnreg.py OUT_DIR
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cases, floor_ms, generator

from sglang_glm5 import bench_real
from sglang_glm5.kernels import nvfp4_moe
from sglang_glm5.moe import fused_moe

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,64,256").split(","))
CAPS = {"shipped": None, "maxnreg168": 168, "maxnreg128": 128}
SHIPPED = nvfp4_moe.nvfp4_moe_gemm1_kernel


class Capped:
    """The gemm1 kernel, launched with a register cap."""

    def __init__(self, cap: int):
        self.cap = cap

    def __getitem__(self, grid):
        return lambda *args, **kwargs: SHIPPED[grid](*args, maxnreg=self.cap, **kwargs)


def main(out: Path) -> None:
    gen = generator(3)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):

        def call(inputs=inputs, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS)

        times = {v: [] for v in CAPS}
        outs = {}
        for _ in range(2):
            for variant, cap in CAPS.items():
                nvfp4_moe.nvfp4_moe_gemm1_kernel = SHIPPED if cap is None else Capped(cap)
                try:
                    times[variant].append(bench_real._time(call, True, len(inputs)))
                    x, w, ids = inputs[0]
                    outs[variant] = fused_moe(x, bundles[0], w, ids, **OP_KWARGS)
                finally:
                    nvfp4_moe.nvfp4_moe_gemm1_kernel = SHIPPED
        med = {v: statistics.median(t) for v, t in times.items()}
        row = {"layout": name, "batch": batch, "floor_ms": floor_ms(inputs, layout, bw), "ms": times,
               "same_bits": {v: bool(torch.equal(outs[v], outs["shipped"])) for v in CAPS}}  # fmt: skip
        rows.append(row)
        cols = "  ".join(f"{v} {med[v] * 1e3:7.2f} us ({med[v] / med['shipped']:.3f})" for v in CAPS)
        same = ",".join(v for v, s in row["same_bits"].items() if s)
        print(f"{name} B={batch:4d} floor {row['floor_ms'] * 1e3:6.1f} us | {cols} | same bits: {same}", flush=True)
    (out / "maxnreg.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
