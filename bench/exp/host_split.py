"""Experiment: the op's host time per call, split by the functions it spends it in.

``host_profile.py`` found the op's host time per call (0.4-0.8 ms on an H100 machine) above its GPU time at every
graph size; cProfile's own cost per Python call blurs where it goes. Here each named function the op calls is
wrapped in a timer (perf_counter, well under a microsecond a call) and the calls are made eagerly, the GPU idle at
the start of each round: per call, microseconds in each, and the rest in ``fused_moe`` / ``w4a16.run`` themselves.
The Triton launch inside route_pairs, launch_gemm1 / the Gluon launch, launch_gemm2 and sum_over_slots is counted in
those; "triton launches" counts ``JITFunction.run`` alone (every launch, both kinds). Settings: "shipped", and
"one chain" (``TWO_CHAINS_TOKENS_PER_EXPERT = None``), or those EXP_SETTINGS names (comma-separated). For EP8 and TP8
at EXP_BATCHES (default 1,8,64,2048).
Usage: python bench/exp/host_split.py OUT_DIR
"""

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from decode_cases import cases, generator, op_calls
from triton.runtime.jit import JITFunction

from sglang_glm5 import autotune, moe
from sglang_glm5.bench import environment
from sglang_glm5.variants import w4a16, w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,8,64,2048").split(","))
CALLS = 4
ROUNDS = 7
SETTINGS = {"shipped": {}, "one chain": {"TWO_CHAINS_TOKENS_PER_EXPERT": None}}
SETTINGS = {k: SETTINGS[k] for k in os.environ.get("EXP_SETTINGS", ",".join(SETTINGS)).split(",")}

spent: dict[str, float] = defaultdict(float)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    return wrapper


# (module, attribute, label): what the op calls through a module global, so that wrapping the global times it
WRAPPED = [
    (moe, "validate_call", "validate_call"),
    (moe, "check_options", "check_options"),
    (moe, "_dense_prefill", "dense_prefill check"),
    (w4a16, "route_pairs", "route_pairs"),
    (w4a16, "launch_gemm1", "launch_gemm1"),
    (w4a16, "launch_gemm2", "launch_gemm2"),
    (w4a16, "sum_over_slots", "sum_over_slots"),
    (w4a16, "uses_pdl", "uses_pdl"),  # before the call plan (w4a16_plan.call_plan)
    (w4a16_plan, "call_plan", "call_plan"),
    (w4a16, "_side_streams", "side streams"),
    (autotune, "pick_config", "pick_config"),
    (w4a16_plan, "plan_gemms", "plan_gemms"),
    (w4a16_plan, "expert_groups", "expert_groups"),
    (w4a16_plan, "sm_count", "sm_count"),
    (w4a16_plan, "overlaps_tail", "overlaps_tail"),
    (w4a16_plan, "awaits_blocks", "awaits_blocks"),
]


def main(out: Path) -> None:
    for module, attr, label in WRAPPED:
        if hasattr(module, attr):
            setattr(module, attr, timed(label, getattr(module, attr)))
    JITFunction.run = timed("triton launches", JITFunction.run)
    w4a16.run = timed("w4a16.run", w4a16.run)
    fused = timed("fused_moe", moe.fused_moe)
    gen = generator(43)
    rows = []
    for name, _layout, bundles, batch, inputs in cases(gen, BATCHES):
        inputs = inputs[:CALLS]
        for setting, attrs in SETTINGS.items():
            saved = {a: getattr(w4a16_plan, a) for a in attrs}
            for a, v in attrs.items():
                setattr(w4a16_plan, a, v)
            try:
                calls = op_calls(inputs, bundles, fused)

                calls()
                torch.cuda.synchronize()
                per_round = []
                for _ in range(ROUNDS):
                    spent.clear()
                    start = time.perf_counter()
                    calls()
                    wall = time.perf_counter() - start
                    torch.cuda.synchronize()
                    per_round.append({"wall": wall, **spent})
                # the round of median wall time, per call in microseconds
                mid = sorted(per_round, key=lambda r: r["wall"])[ROUNDS // 2]
                us = {k: v * 1e6 / CALLS for k, v in mid.items()}
                walls = [r["wall"] * 1e6 / CALLS for r in per_round]
            finally:
                for a, v in saved.items():
                    setattr(w4a16_plan, a, v)
            rows.append({"layout": name, "B": batch, "setting": setting, "us": us, "walls_us": walls})
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(us.items(), key=lambda kv: -kv[1]) if k != "wall")
            print(f"{name} B={batch} {setting}: wall {us['wall']:.0f} us/call (rounds {min(walls):.0f}-"
                  f"{max(walls):.0f}, median {statistics.median(walls):.0f}): {parts}", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    env = environment()
    (out / "host_split.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
