"""Experiment: where the time of the op goes at chunked-prefill sizes (B = 2048, 8192; EXP_BATCHES), per kernel, beside
the bf16 ``_grouped_mm`` layer on the same slots (``bench_real``'s baseline), at one real routing per layout.

Each kernel's device time under the torch profiler, averaged over REPEATS eager calls after a warm-up call.
Usage: python bench/exp/prefill_breakdown.py OUT_DIR
"""

import json
import os
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_glm5 import bench_real, moe
from sglang_glm5.testing import random_layer

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "2048,8192").split(","))
REPEATS = 5


def kernel_ms(fn) -> dict[str, float]:
    """Device ms a call of ``fn`` spends in each kernel (by name, first 48 characters)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            fn()
        torch.cuda.synchronize()
    kernels = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name.split("(")[0][:48]] += e.device_time / REPEATS / 1000
    return dict(kernels)


def main(out: Path) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(os.environ.get("EXP_SEED", "11")))
    rows = []
    for name in ("ep8", "tp8"):
        layout = bench_real.LAYOUTS[name]
        layer = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda")
        w13_t, w2_t = (w.contiguous() for w in bench_real.dequantize_bf16(layer, layout.num_experts, layout.inter))
        bundle = layer.served()  # as the SGLang plugin keeps it
        for batch in BATCHES:
            w, ids = bench_real.real_routing(batch, layout, gen)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            x_sorted, offs, _ = bench_real.sorted_slots(x, ids, layout.num_experts)
            parts = {
                "ours": kernel_ms(partial(moe.fused_moe, x, bundle, w, ids, check_ids=False, num_global_experts=256)),
                "bf16": kernel_ms(partial(bench_real.grouped_mm_moe, x_sorted, w13_t, w2_t, offs, layout.inter)),
            }
            for what, kernels in parts.items():
                total = sum(kernels.values())
                rows.append({"layout": name, "batch": batch, "what": what, "ms": total, "kernels": kernels})
                detail = " ".join(f"{k}={v * 1e3:.0f}us" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]))
                print(f"{name} B={batch} {what}: {total:.3f} ms | {detail}", flush=True)
        del layer, bundle, w13_t, w2_t
        torch.cuda.empty_cache()
    (out / "prefill_breakdown.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
