"""Experiment: at busy decode sizes (GLM-5 B = 32-256, one to eight tokens per expert), gemm2 filling gemm1's last
wave instead of starting after it.

At these sizes the op's four launches run one after another (no PDL: run 20 measured it 1-4% slower with gemm1
letting gemm2 launch after its K loop), and gemm2's programs wait for the whole of gemm1. gemm1 runs four to six waves
of programs; its last wave leaves SMs idle while its slowest programs finish. With per-block ready counters (run 40,
until now only below one token per expert where gemm2 walks several N tiles a program) gemm1 lets gemm2 launch once
every gemm1 program has started, that is during gemm1's last wave, and each gemm2 program waits for its own routing
block's h alone. That pays only if the blocks gemm2 takes first are whole early: in the shipped grid order (blocks
fastest) every block's last N tile runs in gemm1's last wave, so the settings here also put the block axis last
(a block's N tiles side by side) in gemm1 and gemm2.

Settings (each against the launches in turn, "in turn", on the same inputs; the same sums in the same order, so the
same bits):
- "pdl": every launch with PDL (``w4a16_plan.PDL_BELOW_TOKENS_PER_EXPERT`` raised), gemm2 waiting for the whole
  of gemm1;
- "gemm1 blocks last": gemm1's grid alone with the block axis last (its Gluon form; no PDL);
- "blocks last": both GEMMs' grids with the block axis last, no PDL (the order's own cost or gain);
- "pdl + ready": PDL, and gemm2's programs waiting for their block's counter (``w4a16_plan.awaits_blocks`` at any size
  and any number of tiles a program), shipped grid orders;
- "pdl + ready, blocks last": the two together;
- "overlaps_tail": the op as it ships since run 44, which took the last setting into ``w4a16_plan.overlaps_tail``.
Run 44 calls 3 and 4 (bench/README.md) timed the first six before that rule existed, their reference the op as it
then was (the launches in turn at these sizes).
Usage: python bench/exp/busy_overlap.py OUT_DIR   (EXP_BATCHES, default 32,64,128,256; EXP_REPEATS, default 3;
EXP_SETTINGS, default all; BENCH_SEED, default 43)
"""

import dataclasses
import os
import sys
from pathlib import Path

from decode_cases import compare_variants

from sglang_glm5.variants import w4a16_gluon, w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "32,64,128,256").split(","))
REPEATS = int(os.environ.get("EXP_REPEATS", "3"))  # rounds of every setting per case
ANY_SIZE = 1 << 30  # tokens per expert: a threshold every call is below
_shipped_plan = w4a16_plan.plan_gemms


def awaits_any(cfg, plan, num_pairs, num_global_experts, dependent):
    """``w4a16_plan.awaits_blocks`` without its size and tiles-a-program conditions."""
    return dependent and cfg.gemm1.block_m == cfg.gemm2.block_m and not plan.gemm1.stream


def plan_blocks_last(*args, **kwargs):
    """``w4a16_plan.plan_gemms`` with gemm2's grid block axis last (gemm1's Gluon grid takes it from
    BLOCKS_LAST_FROM_M)."""
    plan = _shipped_plan(*args, **kwargs)
    return plan._replace(gemm2=dataclasses.replace(plan.gemm2, blocks_last=True))


TAIL = (w4a16_plan, "TAIL_OVERLAP_MAX_TOKENS_PER_EXPERT")
PDL = {(w4a16_plan, "PDL_BELOW_TOKENS_PER_EXPERT"): ANY_SIZE}
READY = {(w4a16_plan, "AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT"): ANY_SIZE, (w4a16_plan, "awaits_blocks"): awaits_any}
BLOCKS_LAST = {(w4a16_gluon, "BLOCKS_LAST_FROM_M"): 1, (w4a16_plan, "plan_gemms"): plan_blocks_last}
# Every setting but the last turns the op's own rule off (TAIL 0: the launches in turn at these sizes, as before it).
SETTINGS = {
    "in turn": {TAIL: 0},
    "pdl": {TAIL: 0, **PDL},
    "gemm1 blocks last": {TAIL: 0, (w4a16_gluon, "BLOCKS_LAST_FROM_M"): 1},
    "blocks last": {TAIL: 0, **BLOCKS_LAST},
    "pdl + ready": {TAIL: 0, **PDL, **READY},
    "pdl + ready, blocks last": {TAIL: 0, **PDL, **READY, **BLOCKS_LAST},
    "overlaps_tail": {},  # the op as it ships: the last setting built into w4a16 (overlaps_tail)
}
# EXP_SETTINGS: the names to time, comma-separated (default all; the first named is the reference)
CHOSEN = [n for n in os.environ.get("EXP_SETTINGS", ",".join(SETTINGS)).split(",") if n]

if __name__ == "__main__":
    saved = {key: getattr(*key) for values in SETTINGS.values() for key in values}

    def setup(values):
        return lambda: [setattr(mod, attr, value) for (mod, attr), value in {**saved, **values}.items()]

    seed = int(os.environ.get("BENCH_SEED", "43"))
    try:
        compare_variants(Path(sys.argv[1]), "busy_overlap", {v: setup(SETTINGS[v]) for v in CHOSEN}, BATCHES, seed,
                         repeats=REPEATS)  # fmt: skip
    finally:
        for (mod, attr), value in saved.items():
            setattr(mod, attr, value)
