"""What the decode experiments share: the seeded generator, the layers and real routings they time, the op's
keyword arguments and cached tiles for them, the touched-experts floor, and per-kernel device times."""

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


def compare_variants(
    out, name: str, variants: dict, batches, seed: int, repeats: int = 3, bundles_for=None
) -> list[dict]:
    """Time the op at real routing under each variant (name -> a function that sets it up; the first is the
    reference), round-robin ``repeats`` times per case from CUDA graphs over the case's routings, with each
    kernel's device time, whether the outputs are bit-identical to the reference's and their largest relative
    difference. ``bundles_for(variant, bundles)``, if given, returns the layer copies a variant times (the same
    weights in another layout, say); by default every variant times the case's. Prints a line per case and
    writes ``out/name.json`` (after each case). The last variant's setup stays in force: callers restore what they
    changed. The eager calls whose outputs are compared run the chains where a variant has them, as its graphs do
    (``w4a16_plan.EAGER_CHAINS``, restored afterwards)."""
    from sglang_glm5.variants import w4a16_plan

    eager_chains = w4a16_plan.EAGER_CHAINS
    w4a16_plan.EAGER_CHAINS = True
    try:
        return _compare_variants(out, name, variants, batches, seed, repeats, bundles_for)
    finally:
        w4a16_plan.EAGER_CHAINS = eager_chains


def _compare_variants(out, name, variants, batches, seed, repeats, bundles_for) -> list[dict]:
    import json
    import statistics

    from sglang_glm5.moe import fused_moe

    gen = generator(seed)
    bw = bench_real.copy_bandwidth()
    rows = []
    first = next(iter(variants))
    for layout_name, layout, bundles, batch, inputs in cases(gen, batches):
        layers = {v: bundles_for(v, bundles) if bundles_for else bundles for v in variants}

        def call(v, inputs=inputs, layers=layers):
            for i, (x, w, ids) in enumerate(inputs):
                fused_moe(x, layers[v][i % 2], w, ids, **OP_KWARGS)

        times = {v: [] for v in variants}
        outs, kernels = {}, {}
        for rep in range(repeats):
            for v, setup in variants.items():
                setup()
                times[v].append(bench_real._time(lambda v=v: call(v), True, len(inputs)))
                if rep == 0:
                    outs[v] = [fused_moe(x, layers[v][i % 2], w, ids, **OP_KWARGS) for i, (x, w, ids) in
                               enumerate(inputs)]  # fmt: skip
                    kernels[v] = kernel_us(lambda v=v: call(v), len(inputs))
        same = {v: all(torch.equal(a, b) for a, b in zip(outs[first], outs[v], strict=True)) for v in variants}
        rel = {v: max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in
                      zip(outs[v], outs[first], strict=True)) for v in variants}  # fmt: skip
        floor = floor_ms(inputs, layout, bw)
        med = {v: statistics.median(t) for v, t in times.items()}
        line = line_ms(batch, floor)
        rows.append({"layout": layout_name, "batch": batch, "floor_ms": floor, "line_ms": line, "ms": times,
                     "kernels_us": kernels, "bit_identical": same, "rel_diff": rel})  # fmt: skip
        cells = " | ".join(f"{v} {med[v] * 1e3:7.2f} us ({med[v] / med[first]:.3f}"
                           f"{'' if same[v] else f', rel diff {rel[v]:.1e}'})" for v in variants)  # fmt: skip
        line_cell = f" line {line * 1e3:6.1f} us" if line else ""
        print(f"{layout_name} B={batch:4d} floor {floor * 1e3:6.1f} us{line_cell} | {cells}", flush=True)
        for v, ks in kernels.items():
            print(f"    {v}: " + " ".join(f"{k} {t:.1f}" for k, t in sorted(ks.items())), flush=True)
        # rewritten after every case, so that a device call cut short by its time limit keeps the cases it finished
        (out / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def compare_settings(out, name: str, module, settings: dict, batches, seed: int) -> list[dict]:
    """``compare_variants`` over settings of a module's attributes (variant name -> {attribute: value}; the first is
    the reference), the attributes restored afterwards. Each variant starts from the module's own values of every
    attribute any variant sets, so that no setting stays in force into the next variant."""
    saved = {attr: getattr(module, attr) for values in settings.values() for attr in values}

    def setup(values: dict):
        return lambda: [setattr(module, attr, value) for attr, value in {**saved, **values}.items()]

    try:
        return compare_variants(out, name, {v: setup(values) for v, values in settings.items()}, batches, seed)
    finally:
        for attr, value in saved.items():
            setattr(module, attr, value)


def tile_override(**tiles: str):
    """``autotune.pick_config`` with the tiles of the named GEMMs replaced (``gemm1="16x128x256-w8-s3"``), for
    ``compare_settings(..., autotune, {"name": {"pick_config": tile_override(...)}})``."""
    import dataclasses

    from sglang_glm5.tiles import GemmConfig

    pick = autotune.pick_config

    def pick_with(*args, **kwargs):
        return dataclasses.replace(pick(*args, **kwargs), **{g: GemmConfig.from_label(t) for g, t in tiles.items()})

    return pick_with
