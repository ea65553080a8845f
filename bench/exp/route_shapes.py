"""Experiment: the routing launch's shape at busy decode, where taking the launch out of the graph saved the op 4-16 us.

Run 47 (H100, ``no_route.py``): without the routing launch (routes computed before capture, activations not laid
out) the op took 0.944x / 0.946x its time at GLM-5 B = 256 (EP8 / TP8), 0.97-0.98x at B = 64-128. Each of the E + 1
routing programs walks all P ids twice in steps of ``routing.route_block``'s size (1024 ids on 4 warps up to 32768
pairs), and the activation layout's tiles follow them (16 x 256 at the tree run 47 ran). Settings of the routing
module, each against the shipped op on the same inputs (round-robin from CUDA graphs, per-kernel times, the bits
compared): 8 warps; steps of up to 2048 ids; both; steps of up to 256 ids; activation tiles of 64 rows
(``routing.PERMUTE_T`` for every launch: run 47 ran this at 5710111, before ``routing.permute_rows``; since, the busy
sizes take 64 rows by default and the setting changes the other sizes only). Run 47 (H100, seed 43, every output
bit-identical): 64-row tiles 0.978-0.992x at B = 32-256 but EP8 B = 32-64 (1.001x); 8 warps 0.982-0.985x at B = 256
but 1.017x at TP8 B = 8; steps of 256 ids 1.003-1.036x.
Usage: python bench/exp/route_shapes.py OUT_DIR   (EXP_BATCHES, default 8,32,64,128,256; BENCH_SEED, default 43;
EXP_SETTINGS, default all)
"""

import os
import sys
from pathlib import Path

import triton
from decode_cases import compare_settings

from sglang_glm5 import routing

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8,32,64,128,256").split(","))
SHIPPED = routing.route_block


def block_rule(most: int, warps: int, from_pairs: int = 0):
    """``route_block`` with steps of up to ``most`` ids on ``warps`` warps from ``from_pairs`` pairs up to the wide
    routing's sizes (the shipped rule elsewhere)."""

    def rule(num_pairs: int, num_experts: int) -> tuple[int, int]:
        if num_pairs >= routing.WIDE_ROUTE_PAIRS or num_pairs < from_pairs:
            return SHIPPED(num_pairs, num_experts)
        return max(16, min(most, triton.next_power_of_2(num_pairs))), warps

    return rule


SETTINGS = {
    "head": {},
    "w8": {"route_block": block_rule(1024, 8)},
    "b2048": {"route_block": block_rule(2048, 4)},
    "b2048w8": {"route_block": block_rule(2048, 8)},
    "b256": {"route_block": block_rule(256, 4)},
    "tiles64": {"PERMUTE_T": 64},
    # added after run 47 (not run yet): 8 warps from 1024 pairs (GLM-5 B >= 128, where "w8" gained), with 64-row tiles
    "w8-busy": {"route_block": block_rule(1024, 8, from_pairs=1024)},
    # added for run 48: 2048-id steps on 16 warps from 1024 pairs (one step walks all of B = 256's ids)
    "w16-busy": {"route_block": block_rule(2048, 16, from_pairs=1024)},
}
# EXP_SETTINGS: the settings to time (comma-separated; "head" always runs first)
WANTED = os.environ.get("EXP_SETTINGS")
if WANTED:
    SETTINGS = {name: SETTINGS[name] for name in ["head", *(w for w in WANTED.split(",") if w != "head")]}

if __name__ == "__main__":
    seed = int(os.environ.get("BENCH_SEED", "43"))
    compare_settings(Path(sys.argv[1]), "route_shapes", routing, SETTINGS, BATCHES, seed)
