"""Experiment: the routing launch's loop step and warps at prefill sizes (``routing.route_block``).

Each of the routing launch's E + 1 programs walks all P = B * 8 ids twice (a histogram, then its expert's pairs)
in steps of 1024 ids: at B = 8192 that is 128 dependent steps per program, and the launch took 177 us (EP8) and
210 us (TP8) of a 2.7-3.1 ms layer (run 24). This times ``route_pairs`` as the op calls it (with the activation
layout) at real routing for wider steps and more warps, and checks that every output equals the default's.
Usage: python bench/exp/route_block.py OUT_DIR   (EXP_BATCHES, default 1,16,256,2048,8192,16384)
"""

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import triton
from decode_cases import generator

from sglang_glm5 import bench_real, routing
from sglang_glm5.hardware import device_arch
from sglang_glm5.weights import kernel_layout

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,16,256,2048,8192,16384").split(","))
VARIANTS = ((1024, 4), (2048, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16))
DEFAULT = routing.route_block


def main(out: Path) -> None:
    gen = generator(29)
    rows = []
    for name in ("ep8", "tp8"):
        layout = bench_real.LAYOUTS[name]
        for batch in BATCHES:
            _, ids = bench_real.real_routing(batch, layout, gen)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            xp = torch.empty_like(x)
            counters = torch.empty(4096, dtype=torch.int32, device="cuda")

            block_m = 16 if batch <= 256 else 128
            # the weights' layout on this GPU (the activations' K order follows it)
            order = kernel_layout(device_arch("cuda"), layout.hidden, layout.inter)
            route = partial(routing.route_pairs, ids, layout.num_experts, block_m, zero=counters, permute=(x, xp),
                            layout=order)  # fmt: skip

            routing.route_block = DEFAULT
            ref = [t.clone() for t in route()]
            times = {"default": triton.testing.do_bench(route, warmup=25, rep=200, return_mode="median")}
            for block, warps in VARIANTS:
                if block > max(16, triton.next_power_of_2(ids.numel())):
                    continue
                routing.route_block = lambda n, b=block, w=warps: (max(16, min(b, triton.next_power_of_2(n))), w)
                got = route()
                same = all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
                t = triton.testing.do_bench(route, warmup=25, rep=200, return_mode="median")
                times[f"{block}/w{warps}"] = t
                if not same:
                    print(f"  {name} B={batch} {block}/w{warps}: OUTPUT DIFFERS", flush=True)
            routing.route_block = DEFAULT
            rows.append({"layout": name, "batch": batch, "us": {k: v * 1e3 for k, v in times.items()}})
            print(f"{name} B={batch:5d} " + " | ".join(f"{k} {v * 1e3:6.1f} us" for k, v in times.items()), flush=True)
    (out / "route_block.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
