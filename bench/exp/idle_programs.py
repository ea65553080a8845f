"""Experiment: what the W4A16 op's idle programs cost at real routing.

The GEMM grids are sized on the host, without a sync: ``w4a16_plan.plan_launch`` gives about twice the expected
routing blocks (plus two) block programs times the N tiles (times the K splits), and programs past the used
blocks exit at once. This times, for EP8 and TP8 at B = 1 .. 256 (``bench_real`` routing, CUDA graph over 16
routings, round-robin twice on the same inputs):
- ``plan``: the op as shipped;
- ``oracle``: the same launches with exactly the used blocks' programs (read on the host before capture, one
  graph node per routing), i.e. no idle program; what a device-side work list could reach at most;
- ``oracle-split2``: oracle with every GEMM's K split in two (a config's ``split_k``), B >= 32: finer work
  items against the wave tail;
and each kernel's device time under the torch profiler for ``plan`` and ``oracle``.
Usage: python bench/exp/idle_programs.py OUT_DIR
"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, cached_config, cases, floor_ms, generator, kernel_us

from sglang_glm5 import bench_real, routing
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16_plan

BATCHES = (1, 2, 4, 16, 64, 256)
_real_plan = w4a16_plan.plan_gemms
_used: list[tuple[int, int]] = []  # (gemm1 used blocks, gemm2 used blocks) of the next calls, in order


def _oracle(on: bool) -> None:
    """The oracle's grids (``_oracle_plan``) on or off; on, no call's plan is remembered (``w4a16_plan.call_plan``),
    since the oracle plans each call from its own ids."""
    w4a16_plan.plan_gemms = _oracle_plan if on else _real_plan
    w4a16_plan.MEMO_PLANS = 0 if on else _MEMO_PLANS


_MEMO_PLANS = w4a16_plan.MEMO_PLANS


def _oracle_plan(*args, **kwargs):
    plan = _real_plan(*args, **kwargs)
    u1, u2 = _used.pop(0)
    return plan._replace(
        gemm1=dataclasses.replace(plan.gemm1, block_programs=max(1, u1)),
        gemm2=dataclasses.replace(plan.gemm2, block_programs=max(1, u2)),
    )


def _used_blocks(ids, num_experts, cfg) -> tuple[int, int]:
    return tuple(
        int(routing.route_pairs(ids, num_experts, g.block_m).used_blocks.item()) for g in (cfg.gemm1, cfg.gemm2)
    )


def main(out: Path) -> None:
    gen = generator(11)
    bw = bench_real.copy_bandwidth()
    rows = []
    kw = OP_KWARGS
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        cfg = cached_config(layout, batch)
        cfg2 = dataclasses.replace(cfg, gemm1=dataclasses.replace(cfg.gemm1, split_k=2),
                                   gemm2=dataclasses.replace(cfg.gemm2, split_k=2))  # fmt: skip
        used = {id(c): [_used_blocks(ids, layout.num_experts, c) for _, _, ids in inputs] for c in (cfg, cfg2)}
        variants = {"plan": (False, None), "oracle": (True, None)}
        if batch >= 32:
            variants["oracle-split2"] = (True, cfg2)

        def call(oracle, config, inputs=inputs, bundles=bundles, used=used, cfg=cfg):
            if oracle:
                _used[:] = list(used[id(config or cfg)])
                _oracle(True)
            try:
                for i, (x, w, ids) in enumerate(inputs):
                    fused_moe(x, bundles[i % 2], w, ids, config=config, **kw)
            finally:
                _oracle(False)

        times = {v: [] for v in variants}
        outs = {}
        for _ in range(2):
            for v, (oracle, config) in variants.items():
                # _time calls fn three times (compile, capture, and the graph): the oracle list refills each call
                times[v].append(bench_real._time(lambda o=oracle, c=config: call(o, c), True, len(inputs)))
                x, w, ids = inputs[0]
                if oracle:
                    _used[:] = [used[id(config or cfg)][0]]
                    _oracle(True)
                outs[v] = fused_moe(x, bundles[0], w, ids, config=config, **kw)
                _oracle(False)
        kernels = {v: kernel_us(lambda o=oracle: call(o, None), len(inputs)) for v, (oracle, _) in
                   list(variants.items())[:2]}  # fmt: skip
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        same = {v: bool(torch.equal(outs[v], outs["plan"])) for v in outs}
        row = {"layout": name, "batch": batch, "floor_ms": floor, "ms": times, "kernels_us": kernels,
               "config": str(cfg), "used_blocks": used[id(cfg)], "same_bits": same}  # fmt: skip
        rows.append(row)
        cols = "  ".join(f"{v} {med[v] * 1e3:7.2f} us ({med[v] / med['plan']:.3f})" for v in variants)
        kcols = " | ".join(
            f"{v}: " + " ".join(f"{k} {t:.1f}" for k, t in sorted(ks.items())) for v, ks in kernels.items()
        )
        print(f"{name} B={batch:4d} floor {floor * 1e3:6.1f} us | {cols} | {kcols} | same bits "
              f"{','.join(v for v, s in row['same_bits'].items() if s)}", flush=True)  # fmt: skip
    (out / "idle_programs.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
