"""Experiment: an accumulator per K quarter in the W4A16 GEMMs (``QUARTER_ACCS``), against one accumulator.

Runs at commit 094622e (the switch was reverted in 98d0ff0: slower everywhere, bench/README.md run 24).

Each K step of the W4A16 kernels is four quarter-width dots on the decoded weights (kernels/nvfp4_moe.py). Chained
on one accumulator, Triton waits for each wgmma before the next dot of the same loop iteration (``pendings = 0`` in
the TTGIR, ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after every dot in the SASS), so a warpgroup either decodes or
multiplies. With four accumulators (eight in gemm1: gate and up) no dot of a K step waits for another: the waits
become ``0x7`` (Triton 3.8, sm_90, AOT) and the tensor cores run while the next quarter decodes, at the cost of the
accumulators' registers.

For each layout and B this prints the compiled registers, stack and wgmma waits of the cached tiles in both forms
(Triton on this machine), then times the op (CUDA graph over ``bench_real.ROUTINGS`` real routings up to B = 256,
eager above) with one and with four accumulators, round-robin ``REPEATS`` times, with each kernel's device time
and the largest relative difference between the two outputs.
Usage: python bench/exp/quarter_accs.py OUT_DIR   (EXP_BATCHES, default 1,2,4,8,16,32,64,128,256,2048,8192)
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from decode_cases import OP_KWARGS, cached_config, cases, floor_ms, generator, kernel_us

from sglang_glm5 import bench_real
from sglang_glm5.moe import fused_moe
from sglang_glm5.variants import w4a16

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16,32,64,128,256,2048,8192").split(","))
REPEATS = 3
RULES = {"one acc": None, "quarter accs": lambda cfg: True}


def compiled(kernel: str, cfg, form: dict) -> str:
    """'REG n STACK n waits ...' of one kernel form compiled for this GPU (cuobjdump / nvdisasm beside ptxas)."""
    c = w4a16._compile(kernel, cfg, torch.cuda.get_device_capability()[0] * 10, form)
    tools = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        res = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tools / "nvdisasm", "-c", f.name], capture_output=True, text=True).stdout
    waits = "".join(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\w+)", sass))
    regs = " ".join(re.findall(r"REG:\d+|STACK:\d+", res))
    return f"{regs} HGMMA {sass.count('HGMMA')} waits {waits}"


def main(out: Path) -> None:
    gen = generator(23)
    bw = bench_real.copy_bandwidth()
    rows, seen = [], set()
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        cached = cached_config(layout, batch)
        graph = batch <= bench_real.GRAPH_MAX_B
        if not graph:
            inputs = inputs[:1]
        for kernel, cfg in (("gemm1", cached.gemm1), ("gemm2", cached.gemm2)):
            for quarter in (False, True):
                key = (kernel, cfg, quarter)
                if key not in seen:
                    seen.add(key)
                    for form in w4a16.FORMS[kernel]:
                        if kernel == "gemm2" and form["MULTI_TILE"] and quarter:
                            continue  # several tiles per program keep one accumulator
                        print(f"  compiled {kernel} {cfg.label} {form} quarter {quarter}: "
                              f"{compiled(kernel, cfg, {**form, 'QUARTER_ACCS': quarter})}", flush=True)  # fmt: skip

        def call(inputs=inputs, bundles=bundles):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % 2], w, ids, **OP_KWARGS)

        times = {r: [] for r in RULES}
        outs, kernels = {}, {}
        for rep in range(REPEATS):
            for r, rule in RULES.items():
                w4a16.QUARTER_ACCS_RULE = rule
                times[r].append(bench_real._time(call, graph, len(inputs)))
                if rep == 0:
                    x, w, ids = inputs[0]
                    outs[r] = fused_moe(x, bundles[0], w, ids, **OP_KWARGS).float()
                    kernels[r] = kernel_us(call, len(inputs)) if graph else {}
        w4a16.QUARTER_ACCS_RULE = None
        ref = outs["one acc"]
        diff = float((outs["quarter accs"] - ref).abs().max() / ref.abs().max())
        floor = floor_ms(inputs, layout, bw)
        med = {r: statistics.median(t) for r, t in times.items()}
        rows.append({"layout": name, "batch": batch, "cached": str(cached), "floor_ms": floor, "ms": times,
                     "kernels_us": kernels, "max_rel_diff": diff})  # fmt: skip
        ratio = med["quarter accs"] / med["one acc"]
        print(f"{name} B={batch:5d} floor {floor * 1e3:7.1f} us | one acc {med['one acc'] * 1e3:8.1f} us | "
              f"quarter accs {med['quarter accs'] * 1e3:8.1f} us ({ratio:.3f}) | "
              f"floor/ours {floor / med['quarter accs']:.0%} | rel diff {diff:.1e}", flush=True)  # fmt: skip
        for r, ks in kernels.items():
            if ks:
                print(f"    {r}: " + " ".join(f"{k} {t:.1f}" for k, t in sorted(ks.items())), flush=True)
    (out / "quarter_accs.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
