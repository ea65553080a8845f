"""Decode at real routing: the op timed on the expert ids a GLM-5 rank actually sees.

GLM-5 sends each token to 8 of 256 experts (top-8 of a softmax over router logits). Under 8-way
expert parallelism (EP8) rank 0 holds experts 0-31 and sees the other slots as -1; under 8-way tensor
parallelism (TP8) every expert is local with I = 256. With B tokens in a step, a rank under EP8 gets
about B local slots (an eighth of 8 B) over about 32 (1 - e^(-B / 32)) experts: at B = 1-4 only 1-4 are active.

For each B this times, replayed from a CUDA graph (how SGLang runs decode; eager for prefill sizes):

- ours: ``sglang_glm5.moe.nvfp4_fused_moe`` as the SGLang plugin calls it (``check_ids=False``,
  ``num_global_experts=256``);
- bf16: torch ``_grouped_mm`` with bf16 weights on the same local slots, pairs already sorted;
- floor: the NVFP4 bytes of the experts the step touches, over the device copy bandwidth measured in
  the same run;
- with ``peers=("marlin",)``: vLLM's Marlin MoE (``sglang_glm5.peers``) on the same weights (w13 tied to one
  global scale per expert for both, as Marlin needs) and the same routings, timed the same way.
  ``check_marlin`` first compares Marlin and the op with the float64 reference.

Each timed graph runs ``ROUTINGS`` different routings (fresh logits) over ``COPIES`` copies of the
layer in turn, so that the weights a step touches are not already in L2 from the step before (in a
model every layer has its own weights). Times are per call: the graph's median over the routings.

With baselines, eager sizes time the op and bf16 in turn, ``rounds`` times, and report the medians: bf16's eager
time at B = 8192 moves 6-11% between calls of the same process, so one timing of each can put the ratio on either
side of a line.

This module needs only torch, triton, ``nvfp4_fused_moe``, ``testing.random_layer`` and ``nvfp4.dequantize``,
so that it can time an older revision of the op in the same session (``bench/device_run.sh``, ``STEPS=base``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

GLOBAL_EXPERTS = 256
TOP_K = 8
ROUTED_SCALING = 2.5
ROUTINGS = 16  # routings per timed graph
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_BATCHES = (2048, 8192)
GRAPH_MAX_B = 256
ROUNDS = 7  # eager sizes: the op and bf16 timed in turn this many times (medians reported)
GRAPH_ROUNDS = 3  # graph sizes with a peer: the captured graphs replayed in turn this many times (medians reported)
PEERS = ("marlin",)


@dataclass(frozen=True)
class Layout:
    name: str  # "ep8" or "tp8"
    num_experts: int  # local experts
    hidden: int
    inter: int
    first_expert: int  # global id of local expert 0

    @property
    def expert_bytes(self) -> int:
        """NVFP4 bytes of one expert: packed weights, e4m3 scales (one per 16), three fp32 global scales."""
        elems = 3 * self.hidden * self.inter
        return elems // 2 + elems // 16 + 12


LAYOUTS = {
    "ep8": Layout("ep8", 32, 6144, 2048, 0),
    "tp8": Layout("tp8", 256, 6144, 256, 0),
}
SHAPE_LAYOUTS = {"glm5-ep8": "ep8", "glm5-tp8": "tp8"}  # sglang_glm5.shapes names


def real_routing(
    batch: int,
    layout: Layout,
    gen: torch.Generator,
    skew: float = 0.0,
    global_experts: int = GLOBAL_EXPERTS,
    top_k: int = TOP_K,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [B, k] fp32, topk_ids [B, k] int32 local ids, -1 for other ranks' experts).

    Top-k of a softmax over the global experts' router logits; ``skew`` > 0 adds a fixed per-expert
    bias of that standard deviation (popular experts), drawn from the same generator once per call.
    """
    device = gen.device
    logits = torch.randn(batch, global_experts, generator=gen, device=device)
    if skew:
        logits = logits + skew * torch.randn(global_experts, generator=gen, device=device)
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = torch.topk(probs, top_k, dim=-1)
    weights = top_p / top_p.sum(-1, keepdim=True) * ROUTED_SCALING
    local = top_i - layout.first_expert
    ids = torch.where((local >= 0) & (local < layout.num_experts), local, -1).to(torch.int32)
    return weights.float(), ids


def dequantize_bf16(layer, num_experts: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``testing.MoeLayer`` in bf16 for torch's grouped GEMMs: w13 [E, H, 2I] and w2 [E, I, H] (transposed views)."""
    from sglang_glm5 import nvfp4

    g13 = layer.w13_scale_2.reshape(num_experts, -1)
    w13 = nvfp4.dequantize(layer.w13, layer.w13_scale, 1.0, torch.float32)
    w13[:, :inter] *= g13[:, :1, None]
    w13[:, inter:] *= g13[:, -1:, None]
    w2 = nvfp4.dequantize(layer.w2, layer.w2_scale, 1.0, torch.float32) * layer.w2_scale_2[:, None, None]
    return w13.bfloat16().transpose(1, 2), w2.bfloat16().transpose(1, 2)


def grouped_mm_moe(x_sorted, w13_t, w2_t, offs, inter):
    """bf16 grouped MoE on pre-sorted pairs: x_sorted [P, H], w13_t [E, H, 2I], w2_t [E, I, H]."""
    gu = torch._grouped_mm(x_sorted, w13_t, offs=offs)
    h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    return torch._grouped_mm(h, w2_t, offs=offs)


def sorted_slots(x, ids, num_experts: int):
    """The bf16 baseline's inputs: (rows of x for each valid slot, sorted by expert, [P', H]; each expert's end row in
    them, int32 [E]; the flat slot index of each row, [P'])."""
    flat = ids.reshape(-1).long()
    keep = torch.nonzero(flat >= 0).squeeze(1)
    order = keep[torch.argsort(flat[keep], stable=True)]
    offs = torch.cumsum(torch.bincount(flat[keep], minlength=num_experts), 0).to(torch.int32)
    return x[order // TOP_K].contiguous(), offs, order


def slot_sum(y_sorted, order, weights, num_tokens: int):
    """[T, H] fp32: the sorted rows of ``grouped_mm_moe`` times their top-k weights, added per token."""
    y = y_sorted.float() * weights.reshape(-1)[order, None]
    return torch.zeros(num_tokens, y.shape[1], device=y.device).index_add_(0, order // TOP_K, y)


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import triton.testing

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


@dataclass
class Row:
    layout: str
    skew: float
    batch: int
    local_slots: float  # mean over the routings
    active_experts: float
    ms_ours: float
    ms_bf16: float | None
    ms_floor: float
    graph: bool
    rel_err_vs_bf16: float
    rounds: int = 1  # timings of each, in turn with the other (eager sizes); the ms are their medians
    bf16_over_ours_rounds: list[float] = field(default_factory=list)  # per round, where rounds > 1
    ms_marlin: float | None = None  # vLLM's Marlin MoE (peers), same weights and routings
    ours_over_marlin_rounds: list[float] = field(default_factory=list)  # per round, where rounds > 1


def _timer(fn, graph: bool, calls: int) -> Callable[[], float]:
    """A function giving the median ms per call of ``fn`` (which makes ``calls`` calls) each time it is called: one
    CUDA graph of ``fn``, captured here, replayed; or ``fn`` run eagerly."""
    import triton.testing

    if not graph:
        return lambda: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / calls
    fn()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return lambda: triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") / calls


def _time(fn, graph: bool, calls: int) -> float:
    """Median ms per call of ``fn`` (which makes ``calls`` calls), from a CUDA graph replay or eagerly."""
    return _timer(fn, graph, calls)()


def time_in_turn(fns: dict[str, Callable[[], object]], rounds: int, timer: Callable) -> dict[str, list[float]]:
    """Each of ``fns`` timed by ``timer(fn)`` (ms), one after the other, ``rounds`` times over: {name: [ms per round]}.
    Drift of the machine between rounds (clocks, other tenants) then reaches every function alike."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timer(fn))
    return times


def run(
    layout: Layout,
    batches,
    seed: int,
    *,
    skew: float = 0.0,
    copies: int = 2,
    baselines: bool = True,
    op_kwargs=None,
    rounds: int = ROUNDS,
    peers: tuple[str, ...] = (),
) -> list[Row]:
    from sglang_glm5.moe import fused_moe
    from sglang_glm5.testing import random_layer

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise ValueError(f"peers must be among {PEERS}, got {sorted(unknown)}")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    bw = copy_bandwidth()
    layers = [random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda") for _ in range(copies)]
    marlin_layers = []
    if "marlin" in peers:
        from sglang_glm5 import peers as peer_ops

        layers = [peer_ops.tie_gate_up(layer) for layer in layers]
        marlin_layers = [peer_ops.convert(layer) for layer in layers]
    bundles = [layer.served() for layer in layers]  # as the SGLang plugin keeps them
    if baselines:  # contiguous in the transposed layout
        w13_t, w2_t = (w.contiguous() for w in dequantize_bf16(layers[0], layout.num_experts, layout.inter))
    rows = []
    for batch in batches:
        graph = batch <= GRAPH_MAX_B
        n = ROUTINGS if graph else 1
        inputs = []
        for _ in range(n):
            weights, ids = real_routing(batch, layout, gen, skew)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            inputs.append((x, weights, ids))
        kwargs = {"check_ids": False, "num_global_experts": GLOBAL_EXPERTS, **(op_kwargs or {})}

        def ours(inputs=inputs, kwargs=kwargs):
            for i, (x, weights, ids) in enumerate(inputs):
                fused_moe(x, bundles[i % copies], weights, ids, **kwargs)

        def marlin(inputs=inputs):
            for i, (x, weights, ids) in enumerate(inputs):
                peer_ops.marlin_moe(x, marlin_layers[i % copies], weights, ids, GLOBAL_EXPERTS)

        touched = [int(torch.unique(ids[ids >= 0]).numel()) for _, _, ids in inputs]
        slots = [int((ids >= 0).sum()) for _, _, ids in inputs]
        floor = sum(touched) / n * layout.expert_bytes / bw * 1e3
        ms_bf16, err, per_round, ours_over_marlin = None, float("nan"), [], []
        fns = {"ours": ours}
        if baselines:
            sorted_inputs = [(*sorted_slots(x, ids, layout.num_experts), weights) for x, weights, ids in inputs]

            def bf16(sorted_inputs=sorted_inputs):
                for xs, offs, _, _ in sorted_inputs:
                    grouped_mm_moe(xs, w13_t, w2_t, offs, layout.inter)

            fns["bf16"] = bf16
        if marlin_layers:
            fns["marlin"] = marlin
        # Eager sizes: every function timed in turn `rounds` times; graph sizes: each graph captured once and
        # replayed in turn GRAPH_ROUNDS times where a peer is timed (the op against it), else once.
        in_turn = len(fns) > 1 and (rounds > 1 if not graph else bool(marlin_layers))
        turns = (rounds if not graph else GRAPH_ROUNDS) if in_turn else 1
        timers = {name: _timer(fn, graph, n) for name, fn in fns.items()}
        times = time_in_turn(timers, turns, lambda timer: timer())
        ms_ours = statistics.median(times["ours"])
        ms_bf16 = statistics.median(times["bf16"]) if baselines else None
        ms_marlin = statistics.median(times["marlin"]) if marlin_layers else None
        if turns > 1 and baselines:
            per_round = [b / o for o, b in zip(times["ours"], times["bf16"], strict=True)]
        if turns > 1 and marlin_layers:
            ours_over_marlin = [o / m for o, m in zip(times["ours"], times["marlin"], strict=True)]
        if baselines:
            # The op on layer copy 0 against the bf16 path on the same weights.
            x, weights, ids = inputs[0]
            xs, offs, order, _ = sorted_inputs[0]
            got = fused_moe(x, bundles[0], weights, ids, **kwargs).float()
            ref = slot_sum(grouped_mm_moe(xs, w13_t, w2_t, offs, layout.inter), order, weights, batch)
            err = (
                ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item() if ref.norm() > 0 else float(got.abs().max())
            )
        timings = (ms_ours, ms_bf16, floor, graph, err, turns, per_round, ms_marlin, ours_over_marlin)
        rows.append(Row(layout.name, skew, batch, sum(slots) / n, sum(touched) / n, *timings))
        print(fmt(rows[-1]), flush=True)
    return rows


HEADER = (
    "| layout | skew | B | local slots | active experts | ours ms | bf16 _grouped_mm ms | floor ms | floor / ours "
    "| bf16 / ours | rel err vs bf16 | timed |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)
HEADER_MARLIN = (  # rows with the Marlin peer
    "| layout | skew | B | local slots | active experts | ours ms | bf16 _grouped_mm ms | floor ms | floor / ours "
    "| bf16 / ours | rel err vs bf16 | Marlin ms | ours / Marlin | timed |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _spread(values: list[float]) -> str:
    return f" ({min(values):.2f}-{max(values):.2f})" if values else ""


def fmt(r: Row) -> str:
    bf16 = "-" if r.ms_bf16 is None else f"{r.ms_bf16:.4f}"
    ratio = "-" if r.ms_bf16 is None else f"{r.ms_bf16 / r.ms_ours:.2f}x" + _spread(r.bf16_over_ours_rounds)
    kind = "graph" if r.graph else "eager"
    timed = kind if r.rounds == 1 else f"{kind}, {r.rounds} rounds in turn"
    marlin = ""
    if r.ms_marlin is not None:
        marlin = f"| {r.ms_marlin:.4f} | {r.ms_ours / r.ms_marlin:.2f}{_spread(r.ours_over_marlin_rounds)} "
    return (
        f"| {r.layout} | {r.skew:g} | {r.batch} | {r.local_slots:.1f} | {r.active_experts:.1f} | {r.ms_ours:.4f} "
        f"| {bf16} | {r.ms_floor:.4f} | {r.ms_floor / r.ms_ours:.0%} | {ratio} | {r.rel_err_vs_bf16:.1e} "
        f"{marlin}| {timed} |"
    )


def write_results(
    out_dir: Path, name: str, rows: list[Row], environment: dict[str, str], numerics: list[dict] | None = None
) -> Path:
    """NAME.json (rows, environment, numerics) and NAME.md (the tables) under out_dir; returns the .md path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"environment": environment, "rows": [asdict(r) for r in rows], "numerics": numerics or []}
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [f"# {name}: decode at real routing", "", *(f"- {k}: `{v}`" for k, v in environment.items()), ""]
    if numerics:
        lines += ["Against the float64 reference (``check_marlin``):", "", NUMERICS_HEADER,
                  *(fmt_numerics(c) for c in numerics), ""]  # fmt: skip
    header = HEADER_MARLIN if any(r.ms_marlin is not None for r in rows) else HEADER
    lines += [header, *(fmt(r) for r in rows), ""]
    md = out_dir / f"{name}.md"
    md.write_text("\n".join(lines))
    return md


NUMERICS_HEADER = "| layout | tokens | local slots | ours rel err | Marlin rel err |\n|---|---|---|---|---|"
MARLIN_REL_ERR = 4e-2  # vLLM's own Marlin test tolerance
OURS_REL_ERR = 1e-2  # selfcheck's


def fmt_numerics(c: dict) -> str:
    return (
        f"| {c['layout']} | {c['tokens']} | {c['local_slots']} | {c['ours_rel_err']:.2e} | {c['marlin_rel_err']:.2e} |"
    )


def check_marlin(layout: Layout, tokens=(1, 37, 256), seed: int = 1) -> list[dict]:
    """Marlin's and the op's outputs against the float64 reference on one layer (w13 tied, ``peers.tie_gate_up``)
    at real routing (-1 for other ranks' experts): one dict per token count, with ``ok`` (Marlin within
    MARLIN_REL_ERR, the op within OURS_REL_ERR, both finite)."""
    from sglang_glm5 import peers
    from sglang_glm5.moe import fused_moe
    from sglang_glm5.reference import nvfp4_fused_moe_reference
    from sglang_glm5.testing import random_layer

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    layer = peers.tie_gate_up(random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda"))
    bundle, marlin_layer = layer.served(), peers.convert(layer)
    cases = []
    for t in tokens:
        weights, ids = real_routing(t, layout, gen)
        x = torch.randn(t, layout.hidden, generator=gen, device="cuda").bfloat16()
        ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
        outs = {
            "ours": fused_moe(x, bundle, weights, ids, check_ids=False, num_global_experts=GLOBAL_EXPERTS),
            "marlin": peers.marlin_moe(x, marlin_layer, weights, ids, GLOBAL_EXPERTS),
        }
        scale = ref.norm().clamp_min(1e-30)
        errs = {k: ((o.double() - ref).norm() / scale).item() for k, o in outs.items()}
        finite = all(bool(torch.isfinite(o).all()) for o in outs.values())
        ok = finite and errs["ours"] < OURS_REL_ERR and errs["marlin"] < MARLIN_REL_ERR
        cases.append({"layout": layout.name, "tokens": t, "local_slots": int((ids >= 0).sum()),
                      "ours_rel_err": errs["ours"], "marlin_rel_err": errs["marlin"], "ok": ok})  # fmt: skip
        print(fmt_numerics(cases[-1]) + ("" if ok else " FAIL"), flush=True)
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", nargs="+", default=["ep8", "tp8"], choices=sorted(LAYOUTS))
    p.add_argument("--batch", default=",".join(map(str, BATCHES + PREFILL_BATCHES)), help="tokens per step, B")
    p.add_argument("--skew", type=float, nargs="+", default=[0.0], help="per-expert logit bias spread (0 = uniform)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="eager sizes: the op and bf16 timed in turn N times")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",")]
    rows = []
    for name in args.layout:
        for skew in args.skew:
            print(f"{name}, skew {skew}\n{HEADER}", flush=True)
            rows += run(
                LAYOUTS[name], batches, args.seed, skew=skew, baselines=not args.no_baselines, rounds=args.rounds
            )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
