"""What the decode experiments share: the layers and real routings they time, and per-kernel device times."""

from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_glm5 import bench_real
from sglang_glm5.testing import random_layer


def cases(gen: torch.Generator, batches):
    """For EP8 then TP8 and each B: (layout name, layout, two copies of the layer as the plugin keeps it, B,
    ``bench_real.ROUTINGS`` inputs (x [B, H] bf16, topk_weights, topk_ids) at real routing)."""
    for name in ("ep8", "tp8"):
        layout = bench_real.LAYOUTS[name]
        bundles = [
            random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served() for _ in range(2)
        ]
        for batch in batches:
            inputs = []
            for _ in range(bench_real.ROUTINGS):
                w, ids = bench_real.real_routing(batch, layout, gen)
                inputs.append((torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16(), w, ids))
            yield name, layout, bundles, batch, inputs


def kernel_us(fn, calls: int) -> dict[str, float]:
    """Device microseconds per call of each kernel of ``fn`` (which makes ``calls`` calls), from a graph replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            name = ev.name.split("(")[0]
            for short in ("gemm1", "gemm2", "sum", "align"):
                if short in name:
                    name = short
            total[name] += ev.device_time_total
    return {k: v / (reps * calls) for k, v in total.items()}
