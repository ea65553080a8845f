"""What the kept decode experiments share (``gluon_gemm1.py``, ``read_floor.py``): the seeded generator, the layers
and real routings they time, the op's keyword arguments and cached tiles for them, the touched-experts floor, and
per-kernel device times. Nothing here assigns the package's settings: an A/B of settings builds its own."""

import os
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_glm5 import autotune, bench_real
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import MoeConfig

# How the experiments call the op: ids already in range, the routing's global expert count (as the plugin calls it).
OP_KWARGS = {"check_ids": False, "num_global_experts": bench_real.GLOBAL_EXPERTS}


def generator(default_seed: int) -> torch.Generator:
    """A CUDA generator seeded from $BENCH_SEED, else ``default_seed``."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(os.environ.get("BENCH_SEED", str(default_seed))))
    return gen


def cached_config(layout: bench_real.Layout, batch: int) -> MoeConfig:
    """The W4A16 tiles the op picks for B tokens on this layout and GPU."""
    tokens_per_expert = batch * bench_real.TOP_K / bench_real.GLOBAL_EXPERTS
    return autotune.pick_config("w4a16", tokens_per_expert, layout.num_experts, layout.hidden, layout.inter,
                                torch.device("cuda"))  # fmt: skip


def floor_ms(inputs, layout: bench_real.Layout, bandwidth: float) -> float:
    """The touched-experts floor of ``cases`` inputs: the NVFP4 bytes of the experts a step touches, on average,
    at ``bandwidth`` (bytes/s, ``bench_real.copy_bandwidth``), in ms."""
    touched = sum(int(torch.unique(ids[ids >= 0]).numel()) for _, _, ids in inputs) / len(inputs)
    return touched * layout.expert_bytes / bandwidth * 1e3


def line_ms(batch: int, floor: float) -> float | None:
    """The time a step may take by issue 15's lines (H200), in ms, from its touched-experts floor (ms): up to B = 16
    the larger of 0.020 ms and floor / 0.6; B = 32-256 floor / 0.75 (75% of it); None above."""
    if batch <= 16:
        return max(0.020, floor / 0.6)
    return floor / 0.75 if batch <= 256 else None


def cases(gen: torch.Generator, batches):
    """For EP8 then TP8 (EXP_LAYOUTS: comma-separated, default ep8,tp8) and each B: (layout name, layout, two copies
    of the layer as the plugin keeps it, B, ``bench_real.ROUTINGS`` inputs (x [B, H] bf16, topk_weights, topk_ids) at
    real routing)."""
    for name in os.environ.get("EXP_LAYOUTS", "ep8,tp8").split(","):
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


def op_calls(inputs, bundles, op=None):
    """A function that calls the op (``op``, default ``moe.fused_moe``) on each of ``inputs`` in turn, the layer
    copies ``bundles`` taking turns, as the plugin calls it (``OP_KWARGS``)."""
    from sglang_glm5.moe import fused_moe

    op = op or fused_moe

    def calls():
        for i, (x, w, ids) in enumerate(inputs):
            op(x, bundles[i % len(bundles)], w, ids, **OP_KWARGS)

    return calls


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

