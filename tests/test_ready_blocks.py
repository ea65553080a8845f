"""Per-block ready counters: gemm2's programs wait for their routing block's h alone, not for the whole of gemm1.

Below one token per expert, with programmatic dependent launch, where gemm2 walks several N tiles a program, gemm1
counts each routing block's stored N tiles of h (release) and lets gemm2 launch once every gemm1 program has started;
a gemm2 program reads its block and waits until the block's counter reaches gemm1's N tiles (acquire)
(``w4a16_plan.awaits_blocks``). From one to eight tokens per expert the same counters let gemm2 fill gemm1's last wave,
both grids with the block axis last (``w4a16_plan.overlaps_tail``). A wrong count would leave gemm2 waiting forever or
reading h early, so the counts are checked exactly, and the outputs against the plain launches bit for bit. The
interpreter runs the same kernels in order (gemm1 done before gemm2 starts); the GPU tests run them overlapped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_glm5 import moe, routing
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16, w4a16_plan, w4a16_tiles
from sglang_glm5.weights import Nvfp4MoeWeights

HIDDEN, INTER, EXPERTS, TOP_K = 640, 384, 8, 4
# 128-deep steps: with 64, the decode of 16x64 tiles pairs words of two scale blocks on sm_90 (w4a16_pairs)
TILE = GemmConfig(16, 64, 128)
UNSPLIT = GemmConfig(16, 64, 128, split_k=1)  # the tail overlap takes unsplit launches only
SHIPPED = w4a16_plan.PlanSettings()
IN_TURN = dataclasses.replace(SHIPPED, tail_overlap_max_tokens_per_expert=0)  # gemm2 after the whole of gemm1


def _layer_and_routing(num_tokens: int, active: int, gen: torch.Generator, device: torch.device):
    layer = random_layer(EXPERTS, HIDDEN, INTER, gen)
    weights, _ = random_routing(num_tokens, EXPERTS, TOP_K, gen)
    experts = torch.randperm(EXPERTS, generator=gen)[:active].to(torch.int32)
    ids = torch.full((num_tokens, TOP_K), -1, dtype=torch.int32)
    for t in range(num_tokens):  # one to min(top_k, active) distinct local experts, the other slots remote
        n = int(torch.randint(1, min(TOP_K, active) + 1, (1,), generator=gen))
        ids[t, torch.randperm(TOP_K, generator=gen)[:n]] = experts[torch.randperm(active, generator=gen)[:n]]
    x = torch.randn(num_tokens, HIDDEN, generator=gen).bfloat16()
    return layer, x.to(device), weights.to(device), ids.to(device)


def _gemm1(layer, x, ids, splits: int, ready: bool, device):
    w13, s13, g13 = (t.to(device) for t in layer.args()[:3])
    tiles = -(-INTER // TILE.block_n)
    bound = routing.num_blocks_bound(ids.numel(), EXPERTS, TILE.block_m)
    counters = torch.full((bound * tiles + bound,), 7, dtype=torch.int32, device=device)  # the route zeroes them
    route = routing.route_pairs(ids, EXPERTS, TILE.block_m, zero=counters)
    launch = w4a16_plan.Launch(bound, *w4a16_plan.k_splits(HIDDEN, TILE.block_k, splits))
    h = torch.full((ids.numel(), INTER), float("nan"), dtype=torch.bfloat16, device=device)
    part = w4a16.launch_gemm1(routing.prepare_activations(x), w13, s13, g13, route, h, TILE, TOP_K, 0, INTER,
                              routing.interpreting(), launch=launch, counters=counters[: bound * tiles],
                              ready=counters[bound * tiles :] if ready else None)  # fmt: skip
    # the split partials come back for the op to keep alive while gemm2 may run beside gemm1
    assert (part is not None and part.dtype == torch.float32) if launch.splits > 1 else part is None
    return h, route, counters[bound * tiles :]


@pytest.mark.parametrize("splits", [1, 3])  # every program stores its tile; the last of three splits stores it
@pytest.mark.parametrize("num_tokens, active", [(1, 1), (3, 2), (6, 8)])  # one block; two experts; every expert
def test_gemm1_counts_each_blocks_tiles_and_keeps_its_bits(num_tokens, active, splits, gen, device):
    layer, x, _, ids = _layer_and_routing(num_tokens, active, gen, device)
    h, route, ready = _gemm1(layer, x, ids, splits, True, device)
    plain, _, _ = _gemm1(layer, x, ids, splits, False, device)
    used = int(route.used_blocks.item())
    assert used >= 1 and route.block_expert[:used].ge(0).all()
    want = torch.zeros_like(ready)
    want[:used] = -(-INTER // TILE.block_n)  # each used block: every N tile counted once
    assert torch.equal(ready, want), "a used block counts each of its N tiles once, an unused one nothing"
    valid = ids.reshape(-1) >= 0
    assert torch.equal(h[valid], plain[valid]), "the counters change no bit of h"


@pytest.mark.parametrize("per_program, splits", [(1, 1), (1, 2), (3, 1)])  # one tile; a split K; several tiles
def test_gemm2_waiting_for_its_block_gives_the_plain_bits(per_program, splits, gen, device):
    layer, x, weights, ids = _layer_and_routing(5, 3, gen, device)
    h, route, ready = _gemm1(layer, x, ids, 2, True, device)
    w2, s2, g2 = (t.to(device) for t in layer.args()[3:])
    launch = w4a16_plan.Launch(route.block_expert.numel(), *w4a16_plan.k_splits(INTER, TILE.block_k, splits))
    shape = (launch.splits, ids.numel(), HIDDEN) if launch.splits > 1 else (ids.numel(), HIDDEN)

    def gemm2(**kw) -> torch.Tensor:
        y = torch.full(shape, float("nan"), dtype=torch.float32 if launch.splits > 1 else torch.bfloat16, device=device)
        w4a16.launch_gemm2(h, w2, s2, g2, weights.reshape(-1), route, y, TILE, routing.interpreting(),
                           per_program=per_program, launch=launch, **kw)  # fmt: skip
        return y[..., ids.reshape(-1) >= 0, :]

    assert torch.equal(gemm2(ready=ready, ready_tiles=-(-INTER // TILE.block_n)), gemm2())


def test_awaits_blocks_only_below_one_token_per_expert_with_several_gemm2_tiles_a_program():
    cfg = w4a16_tiles.heuristic_config(1 / 16)

    def plan(cfg, pairs, experts, inter):  # GLM-5 on an H200's 132 SMs
        return w4a16_plan.plan_gemms(cfg, pairs, experts, 256, 6144, inter, 132)

    tp8 = plan(cfg, 16, 256, 256)
    assert tp8.per_program > 1 and w4a16_plan.awaits_blocks(cfg, tp8, 16, 256, dependent=True), "GLM-5 TP8 B = 2"
    assert not w4a16_plan.awaits_blocks(cfg, tp8, 16, 256, dependent=False), "gemm2 not a dependent launch: no overlap"
    ep8 = plan(cfg, 16, 32, 2048)
    assert ep8.per_program == 1 and not w4a16_plan.awaits_blocks(cfg, ep8, 16, 256, True), "EP8: a tile a program"
    busy = plan(cfg, 256, 256, 256)
    assert not w4a16_plan.awaits_blocks(cfg, busy, 256, 256, dependent=True), "one token per expert: every expert busy"
    other = MoeConfig(cfg.gemm1, dataclasses.replace(cfg.gemm2, block_m=32))
    assert not w4a16_plan.awaits_blocks(other, plan(other, 16, 256, 256), 16, 256, True), (
        "gemm2 on its own routing: its blocks are not gemm1's"
    )
    stream = MoeConfig(dataclasses.replace(cfg.gemm1, stream=2), cfg.gemm2)
    streamed = plan(stream, 16, 256, 256)
    assert streamed.gemm1.stream and not w4a16_plan.awaits_blocks(stream, streamed, 16, 256, True), (
        "stream-K cuts tiles"
    )


def test_overlaps_tail_from_one_to_eight_tokens_per_expert_on_unsplit_launches():
    def plan(cfg, pairs, experts, inter):  # GLM-5 on an H200's 132 SMs
        return w4a16_plan.plan_gemms(cfg, pairs, experts, 256, 6144, inter, 132)

    for experts, inter in ((32, 2048), (256, 256)):  # EP8, TP8
        for pairs in (256, 2048):  # B = 32 and 256: one and eight tokens per expert
            cfg = w4a16_tiles.heuristic_config(pairs / 256)
            p = plan(cfg, pairs, experts, inter)
            assert w4a16_plan.overlaps_tail(cfg, p, pairs, 256, dependent=True), f"E={experts}, {pairs} pairs"
            ordered = w4a16_plan.in_tail_order(p)  # what the op (and the tuner) then launch
            assert ordered.gemm1.blocks_last and ordered.gemm2.blocks_last and not p.gemm1.blocks_last
            unordered = [dataclasses.replace(g, blocks_last=False) for g in (ordered.gemm1, ordered.gemm2)]
            assert unordered == [p.gemm1, p.gemm2] and ordered.per_program == p.per_program, "the order alone changes"
            assert not w4a16_plan.overlaps_tail(cfg, p, pairs, 256, dependent=False), "gemm2 not a dependent launch"
        for pairs in (128, 4096):  # B = 16 (the ready counters' own rule) and B = 512 (beyond decode)
            cfg = w4a16_tiles.heuristic_config(pairs / 256)
            assert not w4a16_plan.overlaps_tail(cfg, plan(cfg, pairs, experts, inter), pairs, 256, True), (
                f"{pairs} pairs"
            )
    cfg = w4a16_tiles.heuristic_config(1)
    split = MoeConfig(dataclasses.replace(cfg.gemm1, split_k=2), cfg.gemm2)
    assert not w4a16_plan.overlaps_tail(split, plan(split, 256, 32, 2048), 256, 256, True), (
        "a split gemm1: not measured"
    )
    other = MoeConfig(cfg.gemm1, dataclasses.replace(cfg.gemm2, block_m=32))
    assert not w4a16_plan.overlaps_tail(other, plan(other, 256, 32, 2048), 256, 256, True), "gemm2 on its own routing"
    stream = MoeConfig(dataclasses.replace(cfg.gemm1, stream=2), cfg.gemm2)
    streamed = plan(stream, 256, 32, 2048)
    assert streamed.gemm1.stream and not w4a16_plan.overlaps_tail(stream, streamed, 256, 256, True), (
        "stream-K cuts tiles"
    )


def _spy_launches(monkeypatch) -> list[tuple[str, bool, bool]]:
    """(GEMM, block axis last, ready counters) of each GEMM launch the op makes from now on."""
    seen = []

    def spy(gemm: str, launch):
        def launch_and_note(*args, **kwargs):
            seen.append((gemm, kwargs["launch"].blocks_last, kwargs.get("ready") is not None))
            return launch(*args, **kwargs)

        return launch_and_note

    monkeypatch.setattr(w4a16, "launch_gemm1", spy("gemm1", w4a16.launch_gemm1))
    monkeypatch.setattr(w4a16, "launch_gemm2", spy("gemm2", w4a16.launch_gemm2))
    return seen


def _tail_call(layer, num_tokens, device, num_global=EXPERTS, gemm2=UNSPLIT):
    """``layer`` (``random_layer``) on ``device`` as the op takes it, the op's keyword arguments for a call of
    ``num_tokens`` with ``num_global`` experts in all (one to eight pairs each: the tail overlap's sizes) and the plan;
    skipped where gemm2 cannot be a dependent launch."""
    if not (routing.interpreting() or routing.uses_pdl(device)):
        pytest.skip("SGLANG_GLM5_TEST_DEVICE launches nothing with PDL (sm_90+ GPUs do)")
    hidden = layer.w2.shape[1]
    layer = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args()))
    cfg = MoeConfig(UNSPLIT, gemm2)
    pairs = num_tokens * TOP_K
    sms = w4a16_plan.sm_count(None if routing.interpreting() else device.index or 0)
    plan = w4a16_plan.plan_gemms(cfg, pairs, EXPERTS, num_global, hidden, INTER, sms, settings=SHIPPED)
    assert w4a16_plan.overlaps_tail(cfg, plan, pairs, num_global, dependent=True, settings=SHIPPED), (
        f"{num_tokens} tokens overlap the tail"
    )
    kw = {"config": cfg, "check_ids": False, "num_global_experts": num_global, "settings": SHIPPED}
    return layer.for_device(), kw, plan


HALVED = GemmConfig(16, 128, 128, split_k=1)  # a 4-warp tile of 128 rows: gemm2 runs it as two halves, one a program


@pytest.mark.parametrize(
    "num_tokens, active, num_global, gemm2",
    [
        (2, 8, EXPERTS, UNSPLIT),  # one pair per expert
        (6, 3, EXPERTS, UNSPLIT),  # three pairs per expert, on three of them
        (16, 8, EXPERTS, UNSPLIT),  # eight pairs per expert: the rule's top
        (16, 8, EXPERTS, HALVED),  # gemm2's two halves waiting on the counters
        # expert parallelism (8 of 320 experts local): far more local pairs than the plan expects, so a block loop (the
        # fewest tokens that take one here, where the interpreter's time grows with the blocks)
        (80, 8, 320, UNSPLIT),
    ],
)
def test_op_filling_gemm1s_tail_gives_the_bits_of_its_launches_in_turn(
    num_tokens, active, num_global, gemm2, gen, device, monkeypatch
):
    layer, x, weights, ids = _layer_and_routing(num_tokens, active, gen, device)
    layer, kw, plan = _tail_call(layer, num_tokens, device, num_global=num_global, gemm2=gemm2)
    if num_global > EXPERTS:
        bound = routing.num_blocks_bound(ids.numel(), EXPERTS, UNSPLIT.block_m)
        assert plan.gemm1.block_programs < bound and plan.gemm2.block_programs < bound, "the block loop runs"
    if gemm2 is HALVED:
        assert w4a16_plan.halves(gemm2, plan.per_program), "gemm2 in halves"
    seen = _spy_launches(monkeypatch)
    overlapped = moe.fused_moe(x, layer, weights, ids, **kw)
    assert seen == [("gemm1", True, True), ("gemm2", True, True)], "blocks last in both grids, gemm2 on the counters"
    seen.clear()
    in_turn = moe.fused_moe(x, layer, weights, ids, **{**kw, "settings": IN_TURN})
    assert seen == [("gemm1", False, False), ("gemm2", False, False)], "without it: the shipped orders, no counters"
    assert torch.equal(overlapped, in_turn)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="overlapped launches need a GPU")
def test_gemm2_filling_gemm1s_tail_in_a_graph_gives_the_bits_of_the_launches_in_turn(gen, device, monkeypatch):
    # gemm2 launched during gemm1's last wave, replayed from a CUDA graph with other routings (one expert, then all,
    # then two), against the launches one after another
    if device.type != "cuda":
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    layer, kw, _ = _tail_call(random_layer(EXPERTS, 1024, INTER, gen), 12, device)
    x = torch.randn(12, 1024, generator=gen).bfloat16().cuda()
    weights = random_routing(12, EXPERTS, TOP_K, gen)[0].cuda()
    ids = torch.full((12, TOP_K), -1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, layer, weights, ids, **kw)
    for active in (1, EXPERTS, 2):
        ids.copy_(torch.randint(0, active, (12, TOP_K), generator=gen, dtype=torch.int32).cuda())
        ids[0, 1:] = -1
        in_turn = moe.fused_moe(x, layer, weights, ids, **{**kw, "settings": IN_TURN})
        assert torch.equal(moe.fused_moe(x, layer, weights, ids, **kw), in_turn), f"{active} active, eagerly"
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, in_turn), f"{active} active, from the graph"


def test_bad_ready_arguments_are_refused(gen, device):
    layer, x, weights, ids = _layer_and_routing(2, 2, gen, device)
    h, route, ready = _gemm1(layer, x, ids, 1, True, device)
    w13, s13, g13, w2, s2, g2 = (t.to(device) for t in layer.args())
    xp = routing.prepare_activations(x)
    with pytest.raises(ValueError, match="ready: expected"):
        w4a16.launch_gemm1(xp, w13, s13, g13, route, h, TILE, TOP_K, 0, INTER, routing.interpreting(),
                           ready=ready[:-1])  # fmt: skip
    with pytest.raises(ValueError, match="ready: expected"):
        w4a16.launch_gemm1(xp, w13, s13, g13, route, h, TILE, TOP_K, 0, INTER, routing.interpreting(),
                           ready=ready.long())  # fmt: skip
    stream = w4a16_plan.Launch(route.block_expert.numel(), 1, HIDDEN, stream=8)
    with pytest.raises(ValueError, match="stream-K"):
        w4a16.launch_gemm1(xp, w13, s13, g13, route, h, TILE, TOP_K, 0, INTER, routing.interpreting(), launch=stream,
                           counters=torch.zeros(10_000, dtype=torch.int32, device=device), ready=ready)  # fmt: skip
    y = torch.empty(ids.numel(), HIDDEN, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="ready_tiles"):
        w4a16.launch_gemm2(h, w2, s2, g2, weights.reshape(-1), route, y, TILE, routing.interpreting(), ready=ready)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="overlapped launches need a GPU")
def test_overlapped_gemm2_in_a_graph_gives_the_bits_of_the_whole_wait(gen, device, monkeypatch):
    # gemm2 launched while gemm1 runs, each program waiting for its block, eagerly and replayed from a CUDA graph
    # with other routings (one expert, then all), against gemm2 waiting for the whole of gemm1.
    if device.type != "cuda" or not routing.uses_pdl(device):
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not an sm_90+ GPU")
    inter = 256  # one K step of gemm2: several N tiles a program (multi_tile_programs_per_sm lowered to keep them)
    settings = dataclasses.replace(SHIPPED, multi_tile_programs_per_sm=0)
    whole_wait = dataclasses.replace(settings, await_blocks_below_tokens_per_expert=0)
    layer = Nvfp4MoeWeights.build(*(t.cuda() for t in random_layer(EXPERTS, 1024, inter, gen).args())).for_device()
    kw = {"check_ids": False, "num_global_experts": 64, "settings": settings}
    cfg = w4a16_tiles.heuristic_config(24 / 64)
    plan = w4a16_plan.plan_gemms(cfg, 24, EXPERTS, 64, 1024, inter, w4a16_plan.sm_count(device.index or 0),
                                 settings=settings)  # fmt: skip
    assert w4a16_plan.awaits_blocks(cfg, plan, 24, 64, dependent=True, settings=settings), "takes the ready counters"
    x = torch.randn(6, 1024, generator=gen).bfloat16().cuda()
    weights, _ = random_routing(6, EXPERTS, TOP_K, gen)
    weights = weights.cuda()
    ids = torch.full((6, TOP_K), -1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, layer, weights, ids, **kw)
    for active in (1, EXPERTS, 2):
        ids.copy_(torch.randint(0, active, (6, TOP_K), generator=gen, dtype=torch.int32).cuda())
        ids[0, 1:] = -1
        whole = moe.fused_moe(x, layer, weights, ids, **{**kw, "settings": whole_wait})
        assert torch.equal(moe.fused_moe(x, layer, weights, ids, **kw), whole), f"{active} active, eagerly"
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, whole), f"{active} active, from the graph"
