"""Experiment: the fixed cost of a decode step and the cost of each expert it touches, apart.

The issue's lines at GLM-5 B = 2-8 ask the whole op for the larger of 0.020 ms and the touched-experts floor / 0.6.
A step's time is roughly a part that does not depend on the experts touched (four launches, each program's chain of
routing reads, copy latency and split sums) plus a part per touched expert (its bytes at the rate the GEMMs decode).
Real routing moves both together (more tokens, more experts), so this script holds the step's token count T (and
with it the op's launch plan, which depends on T, k, E and the global expert count only) and varies the number of
distinct local experts n its pairs go to:

- EP8 (32 local experts, I = 2048): T tokens, one local slot each (slot position random, the other 7 slots -1, as
  GLM-5 B = T gives about T local slots), the T pairs spread over n random distinct experts;
- TP8 (256 local experts, I = 256): T tokens of 8 distinct experts each, the 8T pairs spread over n random distinct
  experts (n a multiple of 8).

Per (T, n): the op from a CUDA graph over 16 such routings on two copies of the layer (bench_real's timing, as the
bench times real routing), each kernel's device time, and the floor (n experts' NVFP4 bytes at the copy bandwidth
measured in the same run). Per T: the least-squares line t = a + b n, of the op and of each kernel; b against the
floor's time per expert is the rate at which an added expert is decoded. Lines at B = T are then a + b n_B with n_B
the mean touched experts of real routing at that B (sampled here too).
Run 41 (bench/README.md): at EP8 a step touching one expert takes 22.5 us at T = 1 and 27.1 us at T = 2, and the
second expert adds 1.3 us; from T = 4 an added expert costs 5.4-6.5 us (77-93% of the copy bandwidth).
Usage: python bench/exp/chain_fit.py OUT_DIR   (BENCH_SEED, default 43; EXP_EP8="T:n,n;T:n,.."; EXP_TP8 the same)
"""

import json
import os
import sys
from pathlib import Path

import torch
from decode_cases import OP_KWARGS, generator, kernel_us
from line_model import fit, line_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer


def _grid(text: str) -> dict[int, list[int]]:
    """Parses "2:1,2;4:1,2,3,4" to {2: [1, 2], 4: [1, 2, 3, 4]}."""
    return {int(t): [int(n) for n in ns.split(",")] for t, ns in (part.split(":") for part in text.split(";"))}


GRIDS = {
    "ep8": _grid(os.environ.get("EXP_EP8", "1:1;2:1,2;4:1,2,3,4;8:1,2,4,6,8;16:2,4,8,12,16")),
    "tp8": _grid(os.environ.get("EXP_TP8", "1:8;2:8,16;4:8,16,24,32;8:8,16,32,48,64;16:16,32,64,96,128")),
}


def forced_routing(layout: bench_real.Layout, tokens: int, experts: int, gen: torch.Generator):
    """(topk_weights [T, 8] fp32, topk_ids [T, 8] int32): the local pairs go to exactly ``experts`` distinct experts."""
    k = bench_real.TOP_K
    chosen = torch.randperm(layout.num_experts, generator=gen, device=gen.device)[:experts].to(torch.int32)
    ids = torch.full((tokens, k), -1, dtype=torch.int32, device=gen.device)
    token = torch.arange(tokens, device=gen.device)
    if layout.name == "ep8":  # one local slot a token, in a random position; token t's pair to expert t mod n
        slot = torch.randint(0, k, (tokens,), generator=gen, device=gen.device)
        ids[token, slot] = chosen[token % experts]
    else:  # eight distinct experts a token: token t takes group t mod (n / 8) of the chosen experts
        ids = chosen.view(experts // k, k)[token % (experts // k)].contiguous()
    w = torch.rand(tokens, k, generator=gen, device=gen.device) + 0.1
    return (w / w.sum(-1, keepdim=True) * bench_real.ROUTED_SCALING).float(), ids


def real_touched(layout: bench_real.Layout, batch: int, gen: torch.Generator, samples: int = 256) -> float:
    """Mean distinct local experts a real-routing step of ``batch`` tokens touches."""
    total = 0
    for _ in range(samples):
        _, ids = bench_real.real_routing(batch, layout, gen)
        total += int(torch.unique(ids[ids >= 0]).numel())
    return total / samples


if __name__ == "__main__":
    out = Path(sys.argv[1])
    gen = generator(43)
    bw = bench_real.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    report = {"copy_bandwidth": bw, "cases": [], "fits": []}
    for name, grid in GRIDS.items():
        layout = bench_real.LAYOUTS[name]
        per_expert_us = layout.expert_bytes / bw * 1e6
        bundles = [
            random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served() for _ in range(2)
        ]
        for tokens, counts in grid.items():
            points: dict[str, list[tuple[float, float]]] = {}
            for n in counts:
                inputs = []
                for _ in range(bench_real.ROUTINGS):
                    w, ids = forced_routing(layout, tokens, n, gen)
                    x = torch.randn(tokens, layout.hidden, generator=gen, device="cuda").bfloat16()
                    inputs.append((x, w, ids))

                def call(inputs=inputs, bundles=bundles):
                    for i, (x, w, ids) in enumerate(inputs):
                        fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS)

                us = bench_real._time(call, True, len(inputs)) * 1e3
                kernels = kernel_us(call, len(inputs))
                points.setdefault("op", []).append((n, us))
                for k, t in kernels.items():
                    points.setdefault(k, []).append((n, t))
                report["cases"].append({"layout": name, "tokens": tokens, "experts": n, "op_us": us,
                                        "floor_us": n * per_expert_us, "kernels_us": kernels})  # fmt: skip
                cells = " ".join(f"{k} {t:.1f}" for k, t in sorted(kernels.items()))
                print(f"{name} T={tokens:3d} n={n:3d}: op {us:7.2f} us, floor {n * per_expert_us:6.1f} | {cells}",
                      flush=True)  # fmt: skip
            touched = real_touched(layout, tokens, gen)
            fits = {k: fit(p) for k, p in points.items()}
            a, b = fits["op"]
            floor = touched * per_expert_us
            line = line_us(floor)
            row = {"layout": name, "tokens": tokens, "fits": fits, "real_touched": touched, "real_floor_us": floor,
                   "line_us": line, "model_us": a + b * touched}  # fmt: skip
            report["fits"].append(row)
            rate = f"{per_expert_us / b:.0%} of the copy bandwidth" if b > 0 else "-"
            kern = " ".join(f"{k} {ka:.1f}+{kb:.2f}n" for k, (ka, kb) in sorted(fits.items()) if k != "op")
            print(
                f"{name} T={tokens:3d} fit: op = {a:.1f} + {b:.2f} n us (an added expert at {rate}); real routing "
                f"touches {touched:.2f}: model {a + b * touched:.1f} us, line {line:.1f} us | {kern}",
                flush=True,
            )
    (out / "chain_fit.json").write_text(json.dumps(report, indent=1) + "\n")
