"""Experiment: split-K decode launches with a program per possible routing block instead of block loops.

Runs at commit e020781 (its result became the op's rule, ``variants.w4a16.WHOLE_GRID_WITHIN``; bench/README.md run 24).

With a K split the op sizes grid axis 0 for about twice the expected blocks and lets each program walk the used
blocks (``BLOCK_LOOP``; ``variants.w4a16.plan_launch``). Compiled that way the GEMMs take 40-80 more registers a
thread (sm_90 AOT, Triton 3.8: gemm1 16x64x256-w4-s3 223 against 149 at 2 splits, 255 with a spill against 174 at
8; 16x64x128-w4-s4 162 against 96), which holds gemm1 to 2 programs of 4 warps per SM (Nsight Compute at TP8
B = 1: 198 registers, 1.9 warps per scheduler, 0.43 eligible). Idle programs measured free (run 21), so the whole
grid (one program per possible block, the idle ones exit at once) keeps the same split plan and K ranges at fewer
registers. This times the op at real routing both ways (CUDA graph over ``bench_real.ROUTINGS`` routings,
round-robin ``REPEATS`` times), with each kernel's device time, and checks the outputs are bit-identical. The third
variant also puts the block axis last in the grid (``w4a16.BLOCKS_LAST``), so that the used blocks' programs launch
before the idle ones.
Usage: python bench/exp/no_block_loop.py OUT_DIR   (EXP_BATCHES, default 1,2,3,4,6,8,12,16,32,64,128,256)
"""

import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cases, floor_ms, generator, kernel_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16,32,64,128,256").split(","))
REPEATS = 3
PLAN = w4a16.plan_launch


def whole_grid(k_size, cfg, n_programs, blocks_bound, blocks_expected, sms, split=True):
    """``plan_launch`` with a block program per possible block (no block loop), the split unchanged."""
    return dataclasses.replace(PLAN(k_size, cfg, n_programs, blocks_bound, blocks_expected, sms, split),
                               block_programs=blocks_bound)  # fmt: skip


# name: (plan, grid with the block axis last: w4a16.BLOCKS_LAST). "whole grid p3" (the split aiming for 3 programs
# per SM where no cache entry sets a target) ran in the first run and lost at 9 of 24 sizes by up to 1.22x.
VARIANTS = {
    "block loop": (PLAN, False),
    "whole grid": (whole_grid, False),
    "whole grid, blocks last": (whole_grid, True),
}


def main(out: Path) -> None:
    gen = generator(37)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):

        def call(inputs=inputs, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS)

        times = {v: [] for v in VARIANTS}
        outs, kernels = {}, {}
        for rep in range(REPEATS):
            for v, (plan, last) in VARIANTS.items():
                w4a16.plan_launch, w4a16.BLOCKS_LAST = plan, last
                times[v].append(bench_real._time(call, True, len(inputs)))
                if rep == 0:
                    outs[v] = [fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS) for i, (x, w, ids) in
                               enumerate(inputs)]  # fmt: skip
                    kernels[v] = kernel_us(call, len(inputs))
        w4a16.plan_launch, w4a16.BLOCKS_LAST = PLAN, False
        same = all(torch.equal(a, b) for v in VARIANTS for a, b in zip(outs["block loop"], outs[v], strict=True))
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        ratio = med["whole grid"] / med["block loop"]
        ratio3 = med["whole grid, blocks last"] / med["block loop"]
        rows.append({"layout": name, "batch": batch, "floor_ms": floor, "ms": times, "kernels_us": kernels,
                     "bit_identical": same})  # fmt: skip
        print(f"{name} B={batch:4d} floor {floor * 1e3:6.1f} us | block loop {med['block loop'] * 1e3:7.2f} us | "
              f"whole grid {med['whole grid'] * 1e3:7.2f} us ({ratio:.3f}) | blocks last "
              f"{med['whole grid, blocks last'] * 1e3:7.2f} us "
              f"({ratio3:.3f}) | same bits {same}", flush=True)  # fmt: skip
        for v, ks in kernels.items():
            print(f"    {v}: " + " ".join(f"{k} {t:.1f}" for k, t in sorted(ks.items())), flush=True)
    (out / "no_block_loop.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
