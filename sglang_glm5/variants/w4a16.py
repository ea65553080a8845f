"""The W4A16 kernel family: NVFP4 weights decoded in registers, 16-bit activations, any SM80+ GPU.

    P = T * k (token, slot) pairs, E = local experts, H = hidden size, I = intermediate size

The family in three modules:

- ``w4a16_tiles``: what ``variants.KernelVariant`` asks of a family's tiles: the search space, the heuristic
  (feasible everywhere), the kernels' own rule (block_k >= 64), shared memory on a target (an analytic model and
  Triton's ahead-of-time compile);
- ``w4a16_plan``: the grid of a call (``plan_gemms``: K splits at decode, where few experts are active), the rules a
  decode step launches by (PDL, per-block ready counters, gemm2 in gemm1's last wave), and all of them for one call
  (``call_plan``, worked out once per distinct call);
- here: the launches of gemm1 and gemm2 (``kernels/nvfp4_moe.py``, their decode ``kernels/nvfp4_decode.py``; the
  Gluon forms ``w4a16_gluon``), ``run``, the whole W4A16 op on checked arguments, and the family's ``VARIANT``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from fractions import Fraction

import torch

from sglang_glm5._ints import cdiv
from sglang_glm5.hardware import runs_w4a16
from sglang_glm5.kernels import nvfp4_moe as _k
from sglang_glm5.nvfp4 import LAYOUTS
from sglang_glm5.routing import Route, interpreting, route_pairs, sum_over_slots
from sglang_glm5.tiles import GemmConfig, MoeConfig, k_splits_cover
from sglang_glm5.variants import KernelVariant, w4a16_gluon, w4a16_pairs, w4a16_plan, w4a16_tiles
from sglang_glm5.variants.w4a16_plan import Launch

# Part of every autotune cache key: bump it when the W4A16 kernels change in a way that makes
# configs tuned for the old ones meaningless or unsafe (2: weights as the left operand, inline-PTX
# decode; 3: gemm2 may walk several N tiles per program, which can take 2 KB more shared memory; 4: a tile
# whose decode takes a register's two words from two scale blocks is refused (``w4a16_pairs``; on sm_90,
# 16x64x64-w4 with Triton 3.8) and 64-deep gemm2 tiles no longer run as halves: a cache tuned before may
# hold such a tile. The shipped caches' entries were checked and carried over.)
KERNEL_REVISION = 4
# `tune`'s default buckets: decode under expert parallelism (fractions: GLM-5 B = 1 .. 16 tokens per
# step), then 1 .. 2048 tokens per expert.
TUNE_BUCKETS = (*(Fraction(1, 2**n) for n in (5, 4, 3, 2, 1)), 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def _check_launch(launch: Launch, cfg: GemmConfig, k_size: int) -> None:
    if not k_splits_cover(k_size, cfg.block_k, launch.splits, launch.k_per_split):
        raise ValueError(f"launch: {launch} leaves a K split empty or cuts a K step (K = {k_size}, {cfg.label})")


def _whole_grid(route: Route, cfg: GemmConfig, k_size: int) -> Launch:
    """One block program per possible block, no split: the grid of a launch that was not planned."""
    return Launch(route.block_expert.numel(), 1, cdiv(k_size, cfg.block_k) * cfg.block_k)


def _grid(launch: Launch, n_programs: int) -> tuple[int, int, int]:
    """(block programs, N programs, K splits), or with ``launch.blocks_last`` (N programs, K splits, block programs)."""
    if launch.blocks_last:
        return n_programs, launch.splits, launch.block_programs
    return launch.block_programs, n_programs, launch.splits


def launch_gemm1(
    x, w13, w13_scale, gs13, route: Route, h, cfg: GemmConfig, top_k, gate_row0, up_row0, interpret,
    *, launch: Launch | None = None, counters: torch.Tensor | None = None, layout: str = "checkpoint",
    pdl: bool = False, ready: torch.Tensor | None = None, gluon: bool | None = None,
):  # fmt: skip
    """gemm1 into h [P, I]. ``launch`` (default: a program per possible block, no split) with splits > 1 or a
    stream-K schedule needs ``counters``: int32, at least num_blocks * N tiles, zeroed (``route_pairs(zero=...)``).
    ``layout``: that of w13 and its scales (``nvfp4.LAYOUTS``). ``pdl``: programmatic dependent launch
    (``routing.uses_pdl``). ``ready``: int32 [num_blocks], zeroed: each block's stored N tiles are counted there, for
    a gemm2 launched with the same tensor (``launch_gemm2``; not with a stream-K schedule). A config marked ``gluon``
    runs the Gluon kernel where ``w4a16_gluon.applies`` (a program per possible block, the launch's splits), else
    this one; ``gluon``: that answer, where the caller has it (``w4a16_plan.CallPlan.gluon``). Returns the fp32
    scratch the launch writes (split or stream-K partials), or None: a caller whose next launch may run beside this
    one (``ready``) keeps it alive until then, so that the allocator does not hand its memory to that launch while
    this one still uses it."""
    num_pairs, inter = h.shape
    w4a16_tiles.check_config(cfg, "gemm1")
    launch = launch or _whole_grid(route, cfg, x.shape[1])
    _check_launch(launch, cfg, x.shape[1])
    _check_ready(ready, route)
    if ready is not None and launch.stream:
        raise ValueError("ready: per-block ready counters need a planned grid, got a stream-K schedule")
    if gluon is None:
        gluon = w4a16_gluon.applies(h.device, layout, x.shape[1], cfg, x.dtype)
    if gluon:
        # an unsplit launch's blocks-last order carries over; otherwise the Gluon launch's own rule (its split form
        # has not run in that order on a GPU)
        order = True if launch.blocks_last and launch.splits == 1 else None
        return w4a16_gluon.launch(x, w13, w13_scale, gs13, route, h, top_k, gate_row0, up_row0, splits=launch.splits,
                                  k_per_split=launch.k_per_split, counters=counters, pdl=pdl, tile=cfg,
                                  blocks_last=order, ready=ready)  # fmt: skip
    tiles = cdiv(inter, cfg.block_n)
    split = launch.splits > 1
    part = None
    if split or launch.stream:
        if counters is None or counters.numel() < route.block_expert.numel() * tiles:
            raise ValueError(f"counters: this gemm1 launch needs {route.block_expert.numel() * tiles} zeroed int32")
    if split:
        part = torch.empty((launch.splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device)
    if launch.stream:
        units = route.block_expert.numel() * tiles * cdiv(x.shape[1], cfg.block_k)
        if not w4a16_plan.stream_fits(launch.stream, units):
            raise ValueError(f"launch: {launch.stream} stream programs over {units} units overflow int32")
        # two partial tiles (gate and up) per program for its first and its last segment (kernels/nvfp4_moe.py)
        part = torch.empty(launch.stream * 2 * 2 * cfg.block_n * cfg.block_m, dtype=torch.float32, device=h.device)
    w13 = w13.view(torch.int16)  # 4 nibbles per element (kernels/nvfp4_decode.py)
    grid = (launch.stream, 1, 1) if launch.stream else _grid(launch, tiles)
    compiled = _k.nvfp4_moe_gemm1_kernel[grid](
        x_ptr=x,
        w_ptr=w13,
        ws_ptr=w13_scale.view(torch.uint8),
        wgs_ptr=gs13,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        part_ptr=h if part is None else part,
        counter_ptr=route.used_blocks if counters is None else counters,
        ready_ptr=route.used_blocks if ready is None else ready,
        h_ptr=h,
        num_pairs=num_pairs,
        top_k=top_k,
        inter_size=inter,
        hidden_size=x.shape[1],
        k_per_split=launch.k_per_split,
        stride_xt=x.stride(0),
        stride_we=w13.stride(0),
        stride_wn=w13.stride(1),
        stride_se=w13_scale.stride(0),
        stride_sn=w13_scale.stride(1),
        stride_gse=gs13.stride(0),
        stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0,
        stride_ht=h.stride(0),
        gate_row0=gate_row0,
        up_row0=up_row0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=x.shape[1] % cfg.block_k == 0,
        SPLITS=launch.splits,
        BLOCK_LOOP=not launch.stream and launch.block_programs < route.block_expert.numel(),
        LAYOUT=LAYOUTS.index(layout),
        INTERPRETER=interpret,
        PDL=pdl,
        BLOCKS_LAST=launch.blocks_last,
        STREAM=launch.stream > 0,
        READY=ready is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )
    w4a16_pairs.refuse_wrong_pairs(compiled, LAYOUTS.index(layout), f"gemm1 {cfg.label}")
    return part


def _check_ready(ready: torch.Tensor | None, route: Route) -> None:
    if ready is not None and (ready.dtype != torch.int32 or ready.numel() != route.block_expert.numel()):
        raise ValueError(f"ready: expected {route.block_expert.numel()} int32 counters (one a routing block), got "
                         f"{ready.numel()} {ready.dtype}")  # fmt: skip


def launch_gemm2(
    h, w2, w2_scale, gs2, topk_weights_flat, route: Route, y, cfg: GemmConfig, interpret,
    per_program=None, *, launch: Launch | None = None, layout: str = "checkpoint", pdl: bool = False,
    ready: torch.Tensor | None = None, ready_tiles: int = 0, gluon: bool | None = None, halves: bool = True,
):  # fmt: skip
    """gemm2 into y: [P, H] in the hidden states' dtype, or with ``launch.splits`` > 1 the fp32
    partials [splits, P, H] that ``sum_over_slots`` adds. ``per_program``: N tiles per program (>= 1);
    None = ``w4a16_plan.gemm2_tiles_per_program``; several tiles per program and a split K exclude each other.
    ``pdl`` as ``launch_gemm1``. ``ready``: the counters gemm1 filled on the same routing (``launch_gemm1``): a
    program waits until its block's reaches ``ready_tiles`` (gemm1's N tiles) rather than for the whole of gemm1
    (with ``pdl``, while gemm1 still runs). A config marked ``gluon`` runs the Gluon kernel where
    ``w4a16_gluon.applies`` (a program per possible block, the launch's splits and N tiles per program), else this
    one; ``gluon`` as ``launch_gemm1``. ``halves``: each N tile as two halves where ``w4a16_plan.halves`` allows
    (the same bits; off: one whole tile)."""
    hidden = y.shape[-1]
    num_pairs = h.shape[0]
    w4a16_tiles.check_config(cfg, "gemm2", (w2.shape[0], hidden, h.shape[1]))
    w2 = w2.view(torch.int16)
    tiles = cdiv(hidden, cfg.block_n)
    if per_program is None:
        per_program = w4a16_plan.gemm2_tiles_per_program(h.shape[1], cfg)
    elif per_program < 1:
        raise ValueError(f"per_program: expected N tiles per program >= 1, got {per_program}")
    per_program = min(per_program, tiles)
    launch = launch or _whole_grid(route, cfg, h.shape[1])
    _check_launch(launch, cfg, h.shape[1])
    split = launch.splits > 1
    if split and per_program > 1:
        raise ValueError(f"launch: a split K ({launch.splits}) needs one N tile per program, got {per_program}")
    if cfg.one_k_step and per_program < 2:  # its shape was checked above
        raise ValueError(f"config: {cfg.label} runs gemm2 with K in one step and several N tiles a program, got "
                         f"{per_program} of {tiles} a program")  # fmt: skip
    want = (launch.splits, num_pairs, hidden) if split else (num_pairs, hidden)
    if tuple(y.shape) != want or (split and y.dtype != torch.float32):
        raise ValueError(f"y: expected shape {list(want)}{' fp32' if split else ''}, got {list(y.shape)} {y.dtype}")
    _check_ready(ready, route)
    if ready is not None and ready_tiles < 1:
        raise ValueError(f"ready_tiles: expected gemm1's N tiles a block (>= 1), got {ready_tiles}")
    if gluon is None:
        gluon = w4a16_gluon.applies(h.device, layout, h.shape[1], cfg, h.dtype)
    if gluon:
        if ready is not None:
            raise ValueError(f"ready: the Gluon gemm2 ({cfg.label}) waits for the whole of gemm1")
        w4a16_gluon.launch_gemm2(h, w2, w2_scale, gs2, topk_weights_flat, route, y, splits=launch.splits,
                                 k_per_split=launch.k_per_split, per_program=per_program, pdl=pdl,
                                 tile=cfg)  # fmt: skip
        return
    groups = cdiv(tiles, per_program)
    grid = _grid(launch, groups)
    compiled = _k.nvfp4_moe_gemm2_kernel[grid](
        h_ptr=h,
        w_ptr=w2,
        ws_ptr=w2_scale.view(torch.uint8),
        wgs_ptr=gs2,
        topk_weights_ptr=topk_weights_flat,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        ready_ptr=route.used_blocks if ready is None else ready,
        y_ptr=y,
        num_pairs=num_pairs,
        hidden_size=hidden,
        inter_size=h.shape[1],
        k_per_split=launch.k_per_split,
        ready_tiles=ready_tiles,
        stride_ht=h.stride(0),
        stride_we=w2.stride(0),
        stride_wn=w2.stride(1),
        stride_se=w2_scale.stride(0),
        stride_sn=w2_scale.stride(1),
        stride_yt=y.stride(-2),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=h.shape[1] % cfg.block_k == 0,
        MULTI_TILE=per_program > 1,
        ONE_K_STEP=per_program > 1 and h.shape[1] <= cfg.block_k,
        HALVES=halves and w4a16_plan.halves(cfg, per_program),
        SPLITS=launch.splits,
        BLOCK_LOOP=launch.block_programs < route.block_expert.numel(),
        LAYOUT=LAYOUTS.index(layout),
        INTERPRETER=interpret,
        PDL=pdl,
        BLOCKS_LAST=launch.blocks_last,
        READY=ready is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )
    w4a16_pairs.refuse_wrong_pairs(compiled, LAYOUTS.index(layout), f"gemm2 {cfg.label}")


# The tensors of a layer's weights indexed by local expert (``_expert_group`` takes a range of them).
_EXPERT_TENSORS = ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2")
_SIDE_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def _side_streams(index: int, chains: int, main: torch.cuda.Stream) -> list[torch.cuda.Stream]:
    """The streams of chains 1 .. chains - 1 of ``w4a16_plan.expert_groups`` on GPU ``index``, made once, each other
    than ``main`` and than one another: torch hands streams out of a pool of 32 in turn, so a stream made here may be
    one the caller runs on (a graph capture's, say), and the chains would then run one after the other (still right)."""
    streams: list[torch.cuda.Stream] = []
    for chain in range(1, chains):
        stream = _SIDE_STREAMS.get((index, chain))
        for _ in range(64):  # the pool comes round after 32
            if stream is not None and stream != main and stream not in streams:
                break
            stream = torch.cuda.Stream(device=index)
        _SIDE_STREAMS[index, chain] = stream
        streams.append(stream)
    return streams


# The chained calls (``_eager_key``) an eager call has run the chains for in this process (``_eager_plan``)
_CHAINS_LAUNCHED: set[tuple] = set()


def _eager_key(plan: w4a16_plan.CallPlan, cfg, hidden_states, topk_weights, topk_ids, weights, num_global) -> tuple:
    """What picks the chains' compiled kernels beside the plan: the call's sizes, dtypes, the activations' row stride
    and the inputs' 16-byte alignment (Triton specializes its kernels on integer values and pointer alignment, so two
    calls with equal plans, GLM-5 EP8 B = 12 and 13 say, may launch different kernels)."""
    tensors = (hidden_states, topk_weights, topk_ids)
    return (plan, cfg, tuple(topk_ids.shape), weights.shape, weights.layout, num_global, hidden_states.stride(0),
            hidden_states.device.index, *(t.dtype for t in tensors), *(t.data_ptr() % 16 for t in tensors))  # fmt: skip


def _eager_plan(
    plan: w4a16_plan.CallPlan, key: tuple, every_call: bool
) -> tuple[w4a16_plan.CallPlan, tuple | None]:  # fmt: skip
    """(the plan an eager call runs, the key to record in ``_CHAINS_LAUNCHED`` once its launches went out, or None),
    where ``plan`` has chains and the stream is not capturing a CUDA graph: the chains on the first eager call of that
    shape (``_eager_key``), one chain (``plan.alone``, the same bits) on every later one, or the chains on
    ``every_call`` (``PlanSettings.eager_chains``). An eager call's time is its host's (the chains' second routing,
    GEMMs and streams cost 0.25-1 ms a call at GLM-5 EP8 B = 4-16, for a few microseconds of GPU time); a graph
    replays the chains for nothing. The first call runs them so that their kernels are compiled and loaded before
    a capture of that call, which cannot load a kernel (the driver refuses to load a module while a stream captures);
    SGLang runs each batch size eagerly twice before it captures it (0.5.23:
    ``runner_backend/full_cuda_graph_backend.py``, "so kernels are loaded"). A call that raised records nothing."""
    if every_call:
        return plan, None
    if key in _CHAINS_LAUNCHED:
        return plan.alone, None
    # a full memo: every call runs the chains, as a capture would
    return plan, key if len(_CHAINS_LAUNCHED) < w4a16_plan.MEMO_PLANS else None


def _expert_group(weights, first: int, count: int):
    """Experts first .. first + count - 1 of a layer's weights, as views (the W4A16 kernels read no input scales)."""
    take = {name: getattr(weights, name)[first : first + count] for name in _EXPERT_TENSORS}
    return dataclasses.replace(weights, **take, w13_input_scale=None, w2_input_scale=None)


def run(
    hidden_states, weights, topk_weights, topk_ids, *, out, config: MoeConfig, num_global_experts=None,
    settings: w4a16_plan.PlanSettings | None = None,
):  # fmt: skip
    """The W4A16 op on arguments ``moe.fused_moe`` validated (T > 0, ids in range), with tiles ``config``, into
    ``out``, planned with ``settings`` (default ``w4a16_plan.default_settings()``): the routing launch (sort,
    activation layout, split-K counters), gemm1 and gemm2 (in Gluon for a config marked so, where it runs) and the
    top-k sum. Where ``w4a16_plan.expert_groups`` says several, the routing and the GEMMs run as that
    many chains, each over a share of the local experts (every other active expert up to
    ``PlanSettings.interleaved_tokens_per_expert``, chosen by each chain's routing launch on the GPU; above it a
    contiguous group, two: the halves), the first on the caller's stream and each other on a stream of its own (forked
    after the first chain's routing, which lays out the activations for all, and joined before the top-k sum; the
    interpreter runs them in turn), each planned for its share (``w4a16_plan.chain_sms``) with one chain's K splits:
    the same bits as one chain. An eager call runs the chains only on the first call of its shape on the device, one
    chain after that (``_eager_plan``); a CUDA-graph capture runs them always."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = weights.shape
    num_pairs = num_tokens * top_k
    num_global = num_global_experts or num_experts
    device = hidden_states.device
    interpret = interpreting()
    cfg = config
    settings = settings or w4a16_plan.default_settings()
    plan = w4a16_plan.call_plan(cfg, num_pairs, num_experts, num_global, hidden, inter, device, hidden_states.dtype,
                                weights.layout, settings)  # fmt: skip
    launched = None
    if plan.alone is not None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        key = _eager_key(plan, cfg, hidden_states, topk_weights, topk_ids, weights, num_global)
        plan, launched = _eager_plan(plan, key, settings.eager_chains)
    launch1, launch2, per_program = plan.gemms.gemm1, plan.gemms.gemm2, plan.gemms.per_program
    groups, n_counters = plan.chains, plan.gemms.counters
    # each chain's split and ready counters, zeroed by its routing launch
    counters = [
        torch.empty(n_counters + plan.ready, dtype=torch.int32, device=device) if n_counters + plan.ready else None
        for _ in range(groups)
    ]
    xp = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=device)  # x in the GEMMs' K order
    h = torch.empty((num_pairs, inter), dtype=hidden_states.dtype, device=device)
    if launch2.splits > 1:
        y = torch.empty((launch2.splits, num_pairs, hidden), dtype=torch.float32, device=device)
    else:
        y = torch.empty((num_pairs, hidden), dtype=hidden_states.dtype, device=device)
    flat_weights = topk_weights.reshape(-1).contiguous()
    main = sides = None
    if groups > 1 and not interpret:  # each later chain's stream (the interpreter runs the chains one after the other)
        main = torch.cuda.current_stream(device)
        sides = [None, *_side_streams(device.index if device.index is not None else torch.cuda.current_device(),
                                      groups, main)]  # fmt: skip

    def on_chain(group: int):
        return torch.cuda.stream(sides[group]) if group and sides else contextlib.nullcontext()

    gate_row0, up_row0 = weights.gate_up_rows
    route_pdl = "route" in plan.pdl
    chunks = {"chunked_from": settings.chunked_route_pairs, "chunk": settings.route_chunk}
    routes, scratch = [], []
    forked = []
    try:
        for group in range(groups):
            if group and sides:  # a later chain starts after the first one's routing (the activations)
                sides[group].wait_stream(main)
                forked.append(sides[group])
            with on_chain(group):
                if groups == 1 or plan.interleaved:  # every groups-th active expert of all, by its own id
                    own, experts, part = num_experts, {"chain": (group, groups)}, weights
                else:  # the group's experts, as ids 0 .. plan.chain_experts - 1
                    first = group * plan.chain_experts
                    own, experts = plan.chain_experts, {"first_expert": first}
                    part = _expert_group(weights, first, plan.chain_experts)
                route1 = route_pairs(topk_ids, own, cfg.gemm1.block_m, zero=counters[group],
                                     permute=None if group else (hidden_states, xp), pdl=route_pdl,
                                     layout=weights.layout, each_pair=plan.each_pair, **experts, **chunks)  # fmt: skip
                route2 = route1
                if cfg.gemm2.block_m != cfg.gemm1.block_m:
                    route2 = route_pairs(topk_ids, own, cfg.gemm2.block_m, pdl=route_pdl, each_pair=plan.each_pair,
                                         **experts, **chunks)  # fmt: skip
                routes.append((route1, route2, part))
        # gemm1's scratch stays referenced until the op returns: with ready counters gemm2 runs beside gemm1 and must
        # not get its memory for y (the launches after the op wait for gemm2's end, which waits for gemm1's)
        for group, (route1, route2, part) in enumerate(routes):
            ready = counters[group][n_counters:] if plan.ready else None
            with on_chain(group):
                part1 = launch_gemm1(xp, part.w13, part.w13_scale, part.w13_scale_2, route1, h, cfg.gemm1, top_k,
                                     gate_row0, up_row0, interpret, launch=launch1, counters=counters[group],
                                     layout=weights.layout, pdl="gemm1" in plan.pdl, ready=ready,
                                     gluon=plan.gluon[0])  # fmt: skip
                scratch.append(part1)
                launch_gemm2(h, part.w2, part.w2_scale, part.w2_scale_2, flat_weights, route2, y, cfg.gemm2,
                             interpret, per_program=per_program, launch=launch2, layout=weights.layout,
                             pdl="gemm2" in plan.pdl, ready=ready, ready_tiles=plan.ready_tiles,
                             gluon=plan.gluon[1])  # fmt: skip
    finally:
        for side in forked:  # joined even when a launch raised, so that a capture never ends with a stream forked
            main.wait_stream(side)
    sum_over_slots(y, topk_ids, out, num_experts, interpret, pdl="sum" in plan.pdl)
    del scratch
    if launched is not None:  # the chains' kernels are loaded: later eager calls run one chain
        _CHAINS_LAUNCHED.add(launched)
    return out


VARIANT = KernelVariant(
    name="w4a16",
    title="W4A16",
    requires="an SM80+ GPU",
    runs_on=runs_w4a16,
    kernels=w4a16_tiles.KERNELS,
    revision=KERNEL_REVISION,
    tune_buckets=TUNE_BUCKETS,
    decode_buckets=True,
    heuristic=w4a16_tiles.heuristic_config,
    search_space=w4a16_tiles.search_space,
    model_shared_bytes=w4a16_tiles.model_shared_bytes,
    shared_floor=w4a16_tiles.model_shared_floor,
    compiled_shared_bytes=w4a16_tiles.compiled_shared_bytes_many,
    check_config=w4a16_tiles.check_config,
    split_candidates=w4a16_plan.split_candidates,
    resident_aim=w4a16_plan.resident_aim,
    step_split_targets=w4a16_plan.STEP_SPLIT_TRIALS,
    kernel_bencher="sglang_glm5.bench:kernel_bencher",
    selfcheck="sglang_glm5.cli:selfcheck_command",
)
