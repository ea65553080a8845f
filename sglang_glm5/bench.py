"""Kernel benchmark: our NVFP4 MoE op against bf16 and dequantize-then-bf16 grouped GEMMs.

Runs on the local GPU. For each m (tokens per expert, routing balanced so every local expert gets
exactly m pairs) it times, with CUDA events (``triton.testing.do_bench``, median):

- ``nvfp4_triton``: ``sglang_glm5.moe.nvfp4_fused_moe``, everything included (routing sort,
  both GEMMs, SiLU, top-k sum);
- ``bf16_grouped_mm``: torch ``_grouped_mm`` on bf16 weights, pairs already sorted by expert
  (GEMM1, SiLU * up, GEMM2): what the same layer costs with BF16 weights;
- ``dequant_grouped_mm``: NVFP4 weights dequantized to bf16 in torch, then the same ``_grouped_mm``:
  the naive NVFP4 path;
- ``floor``: NVFP4 weight bytes over the device-to-device copy bandwidth measured in the same run.

Up to ``GRAPH_MAX_M`` tokens per expert, ours and the bf16 baseline are also timed replayed from a
CUDA graph (``triton.testing.do_bench_cudagraph``), as SGLang runs decode: no host launch cost. At
these sizes an eager call of the op (seven launches) can take longer on the host than on the GPU,
and then the eager time measures the host.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from sglang_glm5._ints import cdiv
from sglang_glm5.bench_real import copy_bandwidth, dequantize_bf16, grouped_mm_moe
from sglang_glm5.shapes import MoeShape


@dataclass
class BenchRow:
    shape: str
    m: int  # tokens per expert
    tokens: int
    ms_nvfp4: float
    ms_bf16: float | None
    ms_dequant: float | None
    ms_floor: float
    rel_err_vs_bf16: float  # ||ours - bf16 path|| / ||bf16 path||
    ms_nvfp4_graph: float | None = None  # replayed from a CUDA graph (m <= GRAPH_MAX_M)
    ms_bf16_graph: float | None = None


# Tokens per expert up to which the bench also times CUDA-graph replays (decode sizes).
GRAPH_MAX_M = 128


def balanced_routing(shape: MoeShape, m: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """T tokens whose T*k pairs give every local expert exactly m pairs (distinct experts per token)."""
    num_pairs = m * shape.num_experts
    if num_pairs % shape.top_k:
        raise ValueError(f"m={m}: m * E must be a multiple of top_k={shape.top_k}")
    tokens = num_pairs // shape.top_k
    pair = torch.arange(num_pairs, device="cuda")
    # A random permutation of experts per m-group keeps each token's k experts distinct.
    perm = torch.randperm(shape.num_experts, generator=gen, device="cuda")
    ids = perm[pair % shape.num_experts].view(tokens, shape.top_k).to(torch.int32)
    weights = torch.rand(tokens, shape.top_k, generator=gen, device="cuda") + 0.1
    return weights.float(), ids, tokens


def _dequant_grouped_mm_moe(dequant_all, x_sorted, offs, inter):
    w13_t, w2_t = dequant_all()
    return grouped_mm_moe(x_sorted, w13_t, w2_t, offs, inter)


def _graph_ms(fn, name: str) -> float | None:
    """Median ms per call of ``fn`` replayed from a CUDA graph; None (and a line on stderr) if it cannot be captured."""
    import triton.testing

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except RuntimeError as e:
        print(f"bench: {name} could not be captured in a CUDA graph: {e}", file=sys.stderr, flush=True)
        return None


def run(
    shape: MoeShape, ms: tuple[int, ...], seed: int, with_baselines: bool = True, op_kwargs: dict | None = None
) -> tuple[list[BenchRow], float]:
    import triton.testing

    from sglang_glm5.moe import fused_moe
    from sglang_glm5.testing import random_layer

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    bw = copy_bandwidth()
    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
    bundle = layer.served()
    floor_ms = shape.weight_bytes / bw * 1e3

    def dequant_all():
        return dequantize_bf16(layer, shape.num_experts, shape.inter)

    w13_t, w2_t = dequant_all() if with_baselines else (None, None)  # [E, H, 2I], [E, I, H] views
    rows = []
    for i, m in enumerate(ms):
        weights, ids, tokens = balanced_routing(shape, m, gen)
        x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
        args = (x, bundle, weights, ids)
        out = fused_moe(*args, **(op_kwargs or {}))
        # As the SGLang plugin calls it: routing ids are valid by construction, no host-side id check.
        ours = partial(fused_moe, *args, check_ids=False, **(op_kwargs or {}))
        if i == 0:  # about 2 s of work first, so that the first row is not timed while clocks ramp up
            triton.testing.do_bench(ours, warmup=2000, rep=10)
        t_ours = triton.testing.do_bench(ours, warmup=25, rep=200, return_mode="median")
        graphs = m <= GRAPH_MAX_M
        g_ours = _graph_ms(ours, "nvfp4_triton") if graphs else None
        t_bf16 = t_deq = g_bf16 = None
        err = float("nan")
        if with_baselines:
            order = torch.argsort(ids.reshape(-1), stable=True)
            x_sorted = x[order // shape.top_k]
            offs = torch.cumsum(torch.bincount(ids.reshape(-1).long(), minlength=shape.num_experts), 0).to(torch.int32)
            bf16 = partial(grouped_mm_moe, x_sorted, w13_t, w2_t, offs, shape.inter)
            t_bf16 = triton.testing.do_bench(bf16, warmup=25, rep=200, return_mode="median")
            g_bf16 = _graph_ms(bf16, "bf16 _grouped_mm") if graphs else None
            naive = partial(_dequant_grouped_mm_moe, dequant_all, x_sorted, offs, shape.inter)
            t_deq = triton.testing.do_bench(naive, warmup=5, rep=50, return_mode="median")
            y = grouped_mm_moe(x_sorted, w13_t, w2_t, offs, shape.inter).float()
            y = y * weights.reshape(-1)[order, None]
            ref = torch.zeros(tokens, shape.hidden, device="cuda").index_add_(0, order // shape.top_k, y)
            err = ((out.float() - ref).norm() / ref.norm()).item()
        rows.append(BenchRow(str(shape), m, tokens, t_ours, t_bf16, t_deq, floor_ms, err, g_ours, g_bf16))
        print(_fmt_row(rows[-1], shape), flush=True)
    return rows, bw


HEADER = (
    "| m | T | nvfp4_triton ms | bf16 _grouped_mm ms | dequant+_grouped_mm ms | floor ms | ours/floor "
    "| bf16/ours | GB/s | TFLOP/s | rel err vs bf16 path | graph: ours ms | graph: bf16 ms | graph: ours/floor "
    "| graph: bf16/ours |"
)
COLUMNS = HEADER.count("|") - 1


def _fmt_row(r: BenchRow, shape: MoeShape) -> str:
    flops = 2 * r.m * shape.num_experts * 3 * shape.hidden * shape.inter
    gbps = shape.weight_bytes / (r.ms_nvfp4 * 1e-3) / 1e9
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}x"  # noqa: E731
    return (
        f"| {r.m} | {r.tokens} | {r.ms_nvfp4:.3f} | {f(r.ms_bf16)} | {f(r.ms_dequant)} | {r.ms_floor:.3f} "
        f"| {r.ms_nvfp4 / r.ms_floor:.2f}x | {ratio(r.ms_bf16, r.ms_nvfp4)} | {gbps:.0f} "
        f"| {flops / (r.ms_nvfp4 * 1e-3) / 1e12:.1f} | {r.rel_err_vs_bf16:.1e} | {f(r.ms_nvfp4_graph)} "
        f"| {f(r.ms_bf16_graph)} | {ratio(r.ms_nvfp4_graph, r.ms_floor)} | {ratio(r.ms_bf16_graph, r.ms_nvfp4_graph)} |"
    )


def environment() -> dict[str, str]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def write_results(out_dir: Path, name: str, shapes_rows: dict[MoeShape, list[BenchRow]], bw: float) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    payload = {
        "environment": env,
        "copy_bandwidth_GBps": bw / 1e9,
        "results": {str(s): [asdict(r) for r in rows] for s, rows in shapes_rows.items()},
    }
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [f"# {name}", "", *(f"- {k}: `{v}`" for k, v in env.items()), f"- copy bandwidth: {bw / 1e9:.0f} GB/s", ""]
    for s, rows in shapes_rows.items():
        lines += [f"## {s} (NVFP4 weights {s.weight_bytes / 1e6:.0f} MB)", "", HEADER, "|---" * COLUMNS + "|"]
        lines += [_fmt_row(r, s) for r in rows] + [""]
    md = out_dir / f"{name}.md"
    md.write_text("\n".join(lines))
    return md


def rotating_layers(shape: MoeShape, gen: torch.Generator, *, w4a4: bool = False) -> list:
    """Enough random copies of the layer to exceed twice the GPU's L2 cache, for timing in rotation, each
    as the SGLang plugin keeps it (``Nvfp4MoeWeights.for_device``; ``w4a4``: in the checkpoint's layout)."""
    from sglang_glm5.testing import random_layer

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    copies = max(1, cdiv(2 * l2, shape.weight_bytes))
    layers = [random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda") for _ in range(copies)]
    return [layer.served(w4a4=w4a4) for layer in layers]


# Up to this bucket of tokens per expert (GLM-5 EP8/TP8: B = 8192 tokens per step, the chunked-prefill size) the tuner
# times candidates on real routing (``bench_real.real_routing``: top-k of a softmax over all experts, other ranks'
# slots -1); above it the routing is balanced (the inputs of 8 routings grow with the bucket: about 3 GB at GLM-5 EP8's
# 256).
# Real routing matters past the decode buckets too: an expert's pairs spread by about their square root, and a
# 128-row block tile pays for the nearly empty second block that balanced routing never gives it (H200, TP8 at 128
# tokens per expert: timed balanced, the 256-deep gemm1 tile is 0.83x the 64-row one; at real routing 1.02x).
REAL_ROUTING_MAX_BUCKET = 256
TUNE_ROUTINGS = 8  # routings per timed graph in the tuner


def kernel_bencher(shape: MoeShape, seed: int):
    """A ``Bench`` for the tuner: median ms of one GEMM kernel launch on the local GPU (gemm2: with the
    top-k sum after it), replayed from a CUDA graph (decode runs from graphs) of TUNE_ROUTINGS calls, each
    on its own routing and copy of the layer. The copies exceed twice the L2 cache, so a small shape is not
    timed out of L2. The grid (K splits, block programs, and their order: ``w4a16_plan.overlaps_tail``) is the op's own
    for that call (``w4a16_plan.plan_gemms``).
    """
    import triton.testing

    from sglang_glm5 import bench_real, routing
    from sglang_glm5.tiles import MoeConfig
    from sglang_glm5.variants import w4a16, w4a16_plan

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    layers = rotating_layers(shape, gen)
    sms = w4a16_plan.sm_count(torch.cuda.current_device())
    # where the op's gemm2 may fill a tail, decided as the op's plan decides it: its settings and the device
    pdl = w4a16_plan.default_settings().pdl and routing.pdl_runs_on(torch.device("cuda", torch.cuda.current_device()))
    layout = bench_real.Layout("tune", shape.num_experts, shape.hidden, shape.inter, 0)
    inputs: dict = {}

    def routings(bucket) -> list:
        if bucket not in inputs:
            calls = []
            for _ in range(TUNE_ROUTINGS):
                if bucket <= REAL_ROUTING_MAX_BUCKET:
                    tokens = shape.tokens_at(bucket)
                    weights, ids = bench_real.real_routing(tokens, layout, gen, 0.0, shape.all_experts, shape.top_k)
                else:
                    weights, ids, tokens = balanced_routing(shape, max(int(bucket), shape.top_k), gen)
                x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
                h = torch.randn(ids.numel(), shape.inter, generator=gen, device="cuda").bfloat16()
                order = layers[0].layout  # every copy has the same
                xp, hp = routing.prepare_activations(x, order), routing.prepare_activations(h, order)
                calls.append((xp, hp, weights, ids))
            inputs[bucket] = calls
        return inputs[bucket]

    def bench(kernel: str, cfg, bucket) -> float:
        launches = []
        calls = routings(bucket)
        both = MoeConfig(cfg, cfg)  # the tile as both GEMMs' config, for the op's plan
        for i, (x, h, weights, ids) in enumerate(calls):
            layer = layers[i % len(layers)]
            plan = w4a16_plan.plan_gemms(both, ids.numel(), shape.num_experts, shape.all_experts, shape.hidden,
                                         shape.inter, sms)  # fmt: skip
            if w4a16_plan.overlaps_tail(both, plan, ids.numel(), shape.all_experts, pdl):
                plan = w4a16_plan.in_tail_order(plan)  # the grids' order the op runs there (each GEMM timed alone)
            counters = torch.zeros(max(1, plan.counters), dtype=torch.int32, device="cuda")  # kept zero by gemm1
            route = routing.route_pairs(ids, shape.num_experts, cfg.block_m)
            if kernel == "gemm1":
                out = torch.empty(ids.numel(), shape.inter, dtype=torch.bfloat16, device="cuda")
                launches.append(partial(
                    w4a16.launch_gemm1, x, layer.w13, layer.w13_scale, layer.w13_scale_2, route, out, cfg, shape.top_k,
                    0, shape.inter, False, launch=plan.gemm1, counters=counters, layout=layer.layout,
                ))  # fmt: skip
            else:
                split = plan.gemm2.splits
                size = (split, ids.numel(), shape.hidden) if split > 1 else (ids.numel(), shape.hidden)
                out = torch.empty(size, dtype=torch.float32 if split > 1 else torch.bfloat16, device="cuda")
                launches.append(partial(
                    w4a16.launch_gemm2, h, layer.w2, layer.w2_scale, layer.w2_scale_2, weights.reshape(-1), route,
                    out, cfg, False, plan.per_program, launch=plan.gemm2, layout=layer.layout,
                ))  # fmt: skip
                # With the top-k sum that adds its output (and its split partials), as in the op: a split
                # count is judged with the partials' cost.
                y = torch.empty(ids.shape[0], shape.hidden, dtype=torch.bfloat16, device="cuda")
                launches.append(partial(routing.sum_over_slots, out, ids, y, shape.num_experts, False))

        def run_all():
            for launch in launches:
                launch()

        run_all()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_all()
        return triton.testing.do_bench(graph.replay, warmup=5, rep=40, return_mode="median") / len(calls)

    return bench
