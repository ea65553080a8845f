"""Experiment: the op as two chains, each over part of the local experts, on two streams (``w4a16_plan.expert_groups``).

Run 48 (H100, ``expert_halves.py``): two whole op calls over the halves of the experts, on two streams, their outputs
added, took 0.935x the op at EP8 B = 16, 0.966x at TP8 B = 16, 0.973x at TP8 B = 256 and 0.985-1.028x elsewhere at B =
16-256, paying for two routings' sorts, two top-k sums and an add, where the same halves on one stream took 1.07-1.28x:
one chain's launch ramps, tails and waits overlap the other's work. The op's own form shares the activation layout
(the first chain's routing lays it out, the second chain forks after it), the per-pair outputs and one top-k sum.
This times it against one chain on the same inputs, round-robin from CUDA graphs (``compare_settings``); each chain is
planned for its half with one chain's K splits since run 53, so the bits are one chain's (a difference is printed).
It also times more chains over smaller groups of experts, each chain's grids sized for the whole GPU or for its share
of the SMs (``w4a16_plan.CHAINS``, ``CHAIN_SM_SHARE``): at B = 4 a GLM-5 EP8 rank has about four experts active, and
one expert's step (B = 1) takes the H200 20 us for 5 us of bytes, so four such chains side by side would leave the
bandwidth, not the chains, to set the time (a model, to be measured).
Usage: python bench/exp/two_chains.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256; BENCH_SEED, default 43;
EXP_SETTINGS, comma-separated names of SETTINGS, default all; EXP_LAYOUTS, default ep8,tp8)
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_settings

from sglang_glm5.variants import w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256").split(","))
# Run 48 timed "two chains" over every size (the span (0, 8)), before the op took them at its shipped span.
# More chains over smaller groups of experts, and chains sized for their share of the SMs (``w4a16_plan.CHAINS``,
# ``CHAIN_SM_SHARE``), over the same span; these also at TP8 (``CHAINS_MULTI_TILE_GEMM2``).
# These take contiguous groups at every size (``INTERLEAVED_TOKENS_PER_EXPERT`` 0), as runs 48-49 timed them.
EVERY = {"TWO_CHAINS_TOKENS_PER_EXPERT": (0.0, 8.0), "INTERLEAVED_TOKENS_PER_EXPERT": 0.0}
MORE = {**EVERY, "CHAINS_MULTI_TILE_GEMM2": True}
SETTINGS = {
    "one chain": {"TWO_CHAINS_TOKENS_PER_EXPERT": None},
    "two chains": EVERY,
    "shipped": {},
    "two chains on SM shares": {**MORE, "CHAIN_SM_SHARE": True},
    "four chains": {**MORE, "CHAINS": 4},
    "four chains on SM shares": {**MORE, "CHAINS": 4, "CHAIN_SM_SHARE": True},
    "eight chains": {**MORE, "CHAINS": 8},
    "eight chains on SM shares": {**MORE, "CHAINS": 8, "CHAIN_SM_SHARE": True},
    # the shipped span and SM shares, each chain over every other active expert at every size, or over a half of the
    # experts at every size (``INTERLEAVED_TOKENS_PER_EXPERT``; shipped: interleaved up to 1/4 token per expert)
    "interleaved": {"INTERLEAVED_TOKENS_PER_EXPERT": float("inf")},
    "halves": {"INTERLEAVED_TOKENS_PER_EXPERT": 0.0},
}
WANTED = os.environ.get("EXP_SETTINGS")  # the settings to time, comma-separated ("one chain" always runs first)
if WANTED:
    names = ["one chain", *(w.strip() for w in WANTED.split(",") if w.strip() != "one chain")]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        sys.exit(f"EXP_SETTINGS: unknown {unknown}; the settings are {list(SETTINGS)}")
    SETTINGS = {name: SETTINGS[name] for name in names}

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "two_chains", w4a16_plan, SETTINGS, BATCHES, seed)
