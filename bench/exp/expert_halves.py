"""Experiment: the op as two halves over the experts, on two streams, at busy decode.

Each launch of a decode GEMM reads its weights 8-12 us slower than their bytes at the copy bandwidth, whatever its
size (run 43, ``read_pattern.py``: w13 in 103 us for 95, w2 in 59 for 47 on the H200), and gemm2, the shorter
launch, is the weaker of the two (62-76% of the copy bandwidth against gemm1's 74-82%, run 39). The op runs gemm1
over every expert, then gemm2 (filling gemm1's last wave, run 44). If the experts were split in two halves run
concurrently, one half's gemm2 could read while the other half's gemm1 reads, and the launches' ramps would overlap
work. This measures an upper-bound-free version of that with the shipped op unchanged: the layer's experts cut in two
(``w4a16._expert_group``, the op's own: views, no copies), each half routed by its own ids (the other half's slots
-1, precomputed outside the timing), the two op calls on two streams forked from and joined to the capture stream,
their outputs added. It pays for two routings, two top-k sums and the add, so it is pessimistic; the same two
halves on one stream separate what the split costs from what the concurrency gains. Each half reads the cached tiles
of the whole layer (the lookup asked for the whole layer's expert count), so only the split and the streams differ.
Usage: python bench/exp/expert_halves.py OUT_DIR   (EXP_BATCHES, default 16,32,64,128,256; BENCH_SEED, default 43)
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cases, floor_ms, generator

from sglang_glm5 import autotune, bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "16,32,64,128,256").split(","))


def half_ids(ids: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The ids of experts lo .. hi - 1 as that half's local ids, every other slot -1."""
    mine = (ids >= lo) & (ids < hi)
    return torch.where(mine, ids - lo, torch.full_like(ids, -1))


def main(out: Path) -> None:
    gen = generator(43)
    bw = bench_real.copy_bandwidth()
    whole_pick = autotune.pick_config
    side = torch.cuda.Stream()
    rows = []
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        e = layout.num_experts
        mid = e // 2
        halves = [(w4a16._expert_group(b, 0, mid), w4a16._expert_group(b, mid, e - mid)) for b in bundles]
        split_inputs = [(x, w, half_ids(ids, 0, mid), half_ids(ids, mid, e)) for x, w, ids in inputs]

        def pick_whole(kind, m, num_experts, *args, e=e, mid=mid, **kwargs):
            return whole_pick(kind, m, e if num_experts == mid else num_experts, *args, **kwargs)

        autotune.pick_config = pick_whole

        def whole(bundles=bundles, inputs=inputs):
            return [fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS) for i, (x, w, ids) in enumerate(inputs)]

        def one_stream(halves=halves, split_inputs=split_inputs):
            outs = []
            for i, (x, w, ids_a, ids_b) in enumerate(split_inputs):
                a, b = halves[i % 2]
                outs.append(fused_moe(x, a, w, ids_a, **OP_KWARGS) + fused_moe(x, b, w, ids_b, **OP_KWARGS))
            return outs

        def two_streams(halves=halves, split_inputs=split_inputs):
            outs = []
            for i, (x, w, ids_a, ids_b) in enumerate(split_inputs):
                a, b = halves[i % 2]
                main_stream = torch.cuda.current_stream()
                side.wait_stream(main_stream)
                out_a = fused_moe(x, a, w, ids_a, **OP_KWARGS)
                with torch.cuda.stream(side):
                    out_b = fused_moe(x, b, w, ids_b, **OP_KWARGS)
                main_stream.wait_stream(side)
                outs.append(out_a + out_b)
            return outs

        variants = {"op": whole, "halves, one stream": one_stream, "halves, two streams": two_streams}
        try:
            ref = whole()
            rel = {}
            for v, fn in variants.items():
                got = fn()
                torch.cuda.synchronize()
                pairs = zip(got, ref, strict=True)
                rel[v] = max(((g.float() - r.float()).norm() / r.float().norm()).item() for g, r in pairs)
            times = {v: [] for v in variants}
            for _ in range(3):
                for v, fn in variants.items():
                    times[v].append(bench_real._time(fn, True, len(inputs)))
        finally:
            autotune.pick_config = whole_pick
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        rows.append({"layout": name, "batch": batch, "floor_ms": floor, "ms": times, "rel_diff": rel})
        cells = " | ".join(
            f"{v} {med[v] * 1e3:7.2f} us ({med[v] / med['op']:.3f}, {floor / med[v]:.0%} of floor, rel {rel[v]:.1e})"
            for v in variants
        )
        print(f"{name} B={batch:4d} floor {floor * 1e3:6.1f} us | {cells}", flush=True)
    (out / "expert_halves.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
