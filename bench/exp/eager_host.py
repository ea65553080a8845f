"""Experiment: at the eager (chunked-prefill) sizes, is the op's time the GPU's or the host's?

``sglang-glm5 bench`` times B = 2048 and 8192 eagerly, as SGLang runs prefill. An eager time is the larger of the
GPU's work and the host's Python and launch overhead, so a slow host CPU shows up there and nowhere in the graph
sizes. For EP8 and TP8 at EXP_BATCHES (default 2048,8192), over four real routings (decode_cases) and two layer
copies, this times, in ms per call:

- eager: ``triton.testing.do_bench`` median of the calls one after another (what ``bench`` reports for ours);
- host: the host's time to issue the calls with the GPU idle at the start (20 calls, no synchronization inside; the
  launch queue holds them), an upper bound on the host's share when it is below the eager time;
- graph: the same calls captured in a CUDA graph and replayed (no host work at all);
- kernels: the sum of the op's kernels' device times per call (torch profiler over graph replays).

If eager is near host and well above graph, the eager time measures the host. Usage: python bench/exp/eager_host.py
OUT_DIR
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import triton.testing
from decode_cases import cases, generator, kernel_us, op_calls

from sglang_glm5.bench import environment

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "2048,8192").split(","))
CALLS = 4  # routings a timing goes over
ISSUE_ROUNDS = 5


def main(out: Path) -> None:
    gen = generator(43)
    rows = []
    for name, _layout, bundles, batch, inputs in cases(gen, BATCHES):
        inputs = inputs[:CALLS]
        calls = op_calls(inputs, bundles)

        calls()  # compile and allocate
        torch.cuda.synchronize()
        eager = triton.testing.do_bench(calls, warmup=25, rep=200, return_mode="median") / CALLS
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(ISSUE_ROUNDS):
            calls()
        host = (time.perf_counter() - start) * 1e3 / (ISSUE_ROUNDS * CALLS)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            calls()
        graph = triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") / CALLS
        del g
        kernels = kernel_us(calls, CALLS)
        row = {
            "layout": name, "B": batch, "eager_ms": eager, "host_ms": host, "graph_ms": graph,
            "kernels_ms": sum(kernels.values()) / 1e3, "kernels_us": kernels,
        }  # fmt: skip
        rows.append(row)
        print(
            f"{name} B={batch}: eager {eager:.4f} ms, host {host:.4f} ms, graph {graph:.4f} ms, "
            f"kernels {row['kernels_ms']:.4f} ms ({', '.join(f'{k} {v:.1f}' for k, v in sorted(kernels.items()))} us)",
            flush=True,
        )
        torch.cuda.empty_cache()
    env = environment()
    (out / "eager_host.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
