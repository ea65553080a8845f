"""Experiment: where the op's host time goes, per call, at decode and prefill sizes.

SGLang replays decode from CUDA graphs up to ``--cuda-graph-max-bs`` (32 in the SM120 recipes) and runs larger decode
batches and every prefill chunk eagerly, where the op's Python and launch overhead is paid on every call of every
layer. For EP8 and TP8 at EXP_BATCHES (default 1,8,64,256,2048) over four real routings (decode_cases), this times
the host's issue time per call (the GPU idle at the start; 20 calls, no synchronization inside) and the GPU's
(graph replay), then profiles 40 calls with cProfile and writes the functions by own time to host_profile.log.
Usage: python bench/exp/host_profile.py OUT_DIR
"""

import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch
import triton.testing
from decode_cases import cases, generator, op_calls

from sglang_glm5.bench import environment

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,8,64,256,2048").split(","))
CALLS = 4
ROUNDS = 5
TOP = int(os.environ.get("EXP_TOP", "18"))


def main(out: Path) -> None:
    gen = generator(43)
    rows = []
    report = io.StringIO()
    for name, _layout, bundles, batch, inputs in cases(gen, BATCHES):
        inputs = inputs[:CALLS]
        calls = op_calls(inputs, bundles)

        calls()
        torch.cuda.synchronize()
        hosts = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            calls()
            hosts.append((time.perf_counter() - start) * 1e3 / CALLS)
            torch.cuda.synchronize()
        hosts.sort()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            calls()
        graph = triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median") / CALLS
        del g
        eager = triton.testing.do_bench(calls, warmup=25, rep=100, return_mode="median") / CALLS
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(10):
            calls()
        prof.disable()
        torch.cuda.synchronize()
        row = {"layout": name, "B": batch, "host_ms_median": hosts[len(hosts) // 2], "host_ms_min": hosts[0],
               "graph_ms": graph, "eager_ms": eager}  # fmt: skip
        rows.append(row)
        line = (
            f"{name} B={batch}: host {row['host_ms_min']:.3f}-{hosts[-1]:.3f} ms (median {row['host_ms_median']:.3f}),"
            f" graph {graph:.4f} ms, eager {eager:.4f} ms"
        )
        print(line, flush=True)
        report.write(f"\n== {line}\n")
        stats = pstats.Stats(prof, stream=report)
        stats.sort_stats("tottime").print_stats(TOP)
        stats.sort_stats("cumulative").print_stats(TOP)
        torch.cuda.empty_cache()
    (out / "host_profile.log").write_text(report.getvalue())
    env = environment()
    (out / "host_profile.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
