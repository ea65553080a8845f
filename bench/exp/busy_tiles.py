"""Experiment: wider and leaner tiles for the busy decode sizes (B = 32 .. 256 at real routing).

At B = 32-256 every SM is busy and the op ran at 58-64% of the touched-experts floor (run 20); gemm2 was the
further from its share of the floor. This times the op (CUDA graph over 16 routings, ``bench_real`` routing,
round-robin twice on the same inputs) with the cached tiles and with one GEMM's tile replaced: 256 weight rows
per program on 8 warps (half the programs, the per-step overhead over twice the weights), and 8 warps on 128
rows (more warps per SM), with each kernel's device time (torch profiler) and the largest relative difference
from the cached tiles' output.
Usage: python bench/exp/busy_tiles.py OUT_DIR
"""

import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

from decode_cases import OP_KWARGS, cached_config, cases, floor_ms, generator, kernel_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.tiles import GemmConfig

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "32,64,128,256").split(","))
# name: (gemm1 tile or None = cached, gemm2 tile or None)
VARIANTS = {
    "cache": (None, None),
    "g2 16x256x256-w8-s3": (None, "16x256x256-w8-s3"),
    "g2 16x256x128-w8-s3": (None, "16x256x128-w8-s3"),
    "g2 16x256x256-w8-s4": (None, "16x256x256-w8-s4"),
    "g2 16x128x256-w8-s3": (None, "16x128x256-w8-s3"),
    "g1 16x256x128-w8-s3": ("16x256x128-w8-s3", None),
    "g1 16x256x256-w8-s2": ("16x256x256-w8-s2", None),
    "g1 16x128x256-w8-s3": ("16x128x256-w8-s3", None),
    "g1 16x128x128-w4-s4": ("16x128x128-w4-s4", None),
}


def main(out: Path) -> None:
    gen = generator(13)
    bw = bench_real.copy_bandwidth()
    rows = []
    kw = OP_KWARGS
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        cached = cached_config(layout, batch)
        configs = {
            v: dataclasses.replace(
                cached, **{g: GemmConfig.from_label(t) for g, t in zip(("gemm1", "gemm2"), tiles, strict=True) if t}
            )
            for v, tiles in VARIANTS.items()
        }

        def call(config, inputs=inputs, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, config=config, **kw)

        times = {v: [] for v in VARIANTS}
        outs = {}
        for _ in range(2):
            for v, config in configs.items():
                times[v].append(bench_real._time(lambda c=config: call(c), True, len(inputs)))
                x, w, ids = inputs[0]
                outs[v] = fused_moe(x, bundles[0], w, ids, config=config, **kw).float()
        kernels = {v: kernel_us(lambda c=config: call(c), len(inputs)) for v, config in configs.items()}
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        ref = outs["cache"]
        rel = {v: float((o - ref).abs().max() / ref.abs().max()) for v, o in outs.items()}
        rows.append({"layout": name, "batch": batch, "floor_ms": floor, "ms": times, "kernels_us": kernels,
                     "configs": {v: str(c) for v, c in configs.items()}, "rel_diff": rel})  # fmt: skip
        print(f"{name} B={batch:4d} floor {floor * 1e3:6.1f} us, cached {cached}", flush=True)
        for v in VARIANTS:
            ks = " ".join(f"{k} {t:.1f}" for k, t in sorted(kernels[v].items()))
            print(f"  {v:22s} {med[v] * 1e3:7.2f} us ({med[v] / med['cache']:.3f}, floor/ours "
                  f"{floor / med[v]:.0%}) | {ks} | rel diff {rel[v]:.1e}", flush=True)  # fmt: skip
    (out / "busy_tiles.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
