"""The W4A16 op as two chains on two CUDA streams (``w4a16_plan.expert_groups``), each over every other active expert
or over a half of the local experts (``w4a16_plan.interleaves``), and as more chains over smaller shares
(``PlanSettings.chains``).

The chains keep one chain's K splits, so they give its bits. An eager call runs them on its plan's first call only
(``w4a16._eager_plan``); the tests of the chains themselves run them on every call (``PlanSettings.eager_chains``).

The policy, and the chains run one after the other, run on the CPU (the interpreter); the streams, their fork and join
and a CUDA-graph capture of them need a GPU (SGLANG_GLM5_TEST_DEVICE=cuda)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_glm5.moe import fused_moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.routing import CHUNKED_ROUTE_PAIRS
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.variants import w4a16, w4a16_plan
from sglang_glm5.variants.w4a16_plan import PlanSettings
from sglang_glm5.weights import Nvfp4MoeWeights

# The chains' experts by name: PlanSettings.interleaved_tokens_per_expert for contiguous groups at any size, or every
# n-th active expert at any size
INTERLEAVED = {"halves": 0.0, "interleaved": float("inf")}
SHIPPED = PlanSettings()
EVERY_CALL = dataclasses.replace(SHIPPED, eager_chains=True)  # eager calls run the chains every time, as a capture does
ONE = dataclasses.replace(EVERY_CALL, two_chains=False)
ALWAYS = dataclasses.replace(EVERY_CALL, chains_tokens_per_expert=(0, float("inf")))  # the chains at any size
SPAN = (1 / 32, 8)


def chained(**changes) -> PlanSettings:
    """The chains at any size, on every call, with ``changes``."""
    return dataclasses.replace(ALWAYS, **changes)


@pytest.mark.parametrize("span,pairs,experts,one_launch,tiles,switch,want", [
    (None, 256, 32, True, 1, "1", 1),  # no span: one chain
    ((1 / 32, 8), 256, 30, True, 1, "1", 2),  # an even count: halves
    ((1 / 32, 8), 8, 32, True, 1, "1", 2),  # B = 1 of GLM-5 EP8: 8 pairs over 256 global experts is 1/32
    ((1 / 32, 8), 8, 32, True, 1, "0", 1),  # SGLANG_GLM5_TWO_CHAINS=0
    ((1 / 32, 8), 4, 32, True, 1, "1", 1),  # under the span
    ((1 / 32, 8), 2049, 32, True, 1, "1", 1),  # over it
    ((1 / 32, 8), 256, 31, True, 1, "1", 1),  # an odd expert count has no halves
    ((1 / 32, 8), 256, 32, False, 1, "1", 1),  # a two-launch (chunked) routing: one chain
    ((1 / 32, 8), 256, 32, True, 2, "1", 1),  # gemm2 walking several N tiles a program (GLM-5 TP8)
])  # fmt: skip
def test_expert_groups_follow_the_span(span, pairs, experts, one_launch, tiles, switch, want):
    settings = dataclasses.replace(SHIPPED, two_chains=span is not None and switch == "1",
                                   chains_tokens_per_expert=span or SHIPPED.chains_tokens_per_expert)  # fmt: skip
    assert w4a16_plan.expert_groups(pairs, experts, 256, one_launch, tiles, settings) == want


def test_multi_tile_gemm2_keeps_one_chain():
    # GLM-5 TP8 (gemm2 walks several N tiles a program, each waiting for its own block's h) keeps one chain
    settings = dataclasses.replace(SHIPPED, chains_tokens_per_expert=SPAN)
    assert w4a16_plan.expert_groups(64, 256, 256, True, 4, settings) == 1
    assert w4a16_plan.expert_groups(64, 256, 256, True, 1, settings) == 2


@pytest.mark.parametrize("chains,experts,want", [
    (4, 32, 4),  # GLM-5 EP8: four groups of eight
    (8, 32, 8),  # eight groups of four
    (4, 30, 1),  # four does not divide 30: one chain, not uneven groups
    (1, 32, 1),  # one chain asked for
])  # fmt: skip
def test_more_chains_take_equal_groups(chains, experts, want):
    settings = dataclasses.replace(SHIPPED, chains_tokens_per_expert=SPAN, chains=chains)
    assert w4a16_plan.expert_groups(64, experts, 256, True, 1, settings) == want


@pytest.mark.parametrize("sms,chains,want", [
    (132, 4, 33),  # each chain sized for its share
    (188, 8, 23),  # SM120's 188 SMs in eight: the remainder idles rather than oversubscribing
    (2, 4, 1),  # never below one SM
])  # fmt: skip
def test_chain_sms(sms, chains, want):
    assert w4a16_plan.chain_sms(sms, chains) == want


def test_glm5_ep8_decode_takes_two_chains_from_4_to_16_tokens_and_tp8_none():
    # The shipped span on GLM-5's layouts: EP8 (I = 2048: gemm2 one N tile a program) B = 4-16, TP8 (I = 256) never.
    from sglang_glm5.tiles import GemmConfig

    tile = GemmConfig(16, 64, 256, num_warps=4, num_stages=3)
    ep8 = [
        b
        for b in range(1, 257)
        if w4a16_plan.expert_groups(8 * b, 32, 256, True, w4a16_plan.gemm2_tiles_per_program(2048, tile), SHIPPED) == 2
    ]
    tp8 = [
        b
        for b in range(1, 257)
        if w4a16_plan.expert_groups(8 * b, 256, 256, True, w4a16_plan.gemm2_tiles_per_program(256, tile), SHIPPED) == 2
    ]
    assert ep8 == list(range(4, 17)) and tp8 == []


def test_glm5_ep8_chains_interleave_up_to_8_tokens_and_take_halves_above():
    # The shipped threshold on GLM-5 EP8's chained steps (B = 4-16): every other active expert up to B = 8 (1/4 token
    # per expert), where it measured faster; the halves at B = 9-16, where it did not.
    chained = range(4, 17)
    assert [b for b in chained if w4a16_plan.interleaves(8 * b, 256, SHIPPED)] == list(range(4, 9))


@pytest.mark.parametrize("chains,groups", [
    (2, [(0, 4), (4, 4)]),  # the halves, as shipped
    (4, [(0, 2), (2, 2), (4, 2), (6, 2)]),  # more chains: the first and the last group's experts both take ids
])  # fmt: skip
def test_chains_in_turn_match_the_reference_and_one_chain(chains, groups, gen, device, monkeypatch):
    # The split itself (each group's weights as views, its ids routed as its own, one activation layout, shared
    # per-pair outputs, one top-k sum), through the interpreter on the CPU (on a GPU: streams, the tests below too).
    # Ids in the first and last groups and remote ones; I = 1280 so that gemm2 walks one N tile a program.
    settings = chained(chains=chains, interleaved_tokens_per_expert=0.0)  # the groups, at any size
    layer, weights = _layer(gen, device, num_experts=8, hidden=128)
    x = torch.randn(3, 128, generator=gen).bfloat16()
    w, ids = random_routing(3, 8, 2, gen, remote_fraction=0.25)
    ids[0] = torch.tensor([1, 6], dtype=ids.dtype)
    args = (x.to(device), weights, w.to(device), ids.to(device))
    kwargs = {"check_ids": False, "num_global_experts": 64}
    one = fused_moe(*args, **kwargs, settings=ONE)
    tiles = w4a16_plan.gemm2_tiles_per_program(1280, _lookup_gemm2(device))
    assert w4a16_plan.expert_groups(6, 8, 64, True, tiles, settings) == chains
    halves, _ = _spy_shares(monkeypatch)
    two = fused_moe(*args, **kwargs, settings=settings)
    assert halves == groups, "the op ran another split"
    want = nvfp4_fused_moe_reference(x, *layer.args(), w, ids)
    assert _rel(one, want) < 1e-2 and _rel(two, want) < 1e-2
    assert torch.equal(two, one)  # one chain's K splits: its bits


# The shipped threshold through the op: 6 pairs over 64 global experts (0.09 token per expert) interleave, over 16
# (0.375) take the halves.
@pytest.mark.parametrize("num_global,interleaved", [(64, True), (16, False)])
def test_the_op_interleaves_below_the_shipped_threshold_and_takes_halves_above(
    num_global, interleaved, gen, device, monkeypatch
):
    assert 6 / 64 <= SHIPPED.interleaved_tokens_per_expert < 6 / 16
    layer, weights = _layer(gen, device, num_experts=8, hidden=128)
    x = torch.randn(3, 128, generator=gen).bfloat16()
    w, _ = random_routing(3, 8, 2, gen)
    ids = torch.tensor([[1, 6], [2, -1], [-1, 5]], dtype=torch.int32)
    sliced, routed = _spy_shares(monkeypatch)
    got = fused_moe(x.to(device), weights, w.to(device), ids.to(device), check_ids=False, num_global_experts=num_global,
                    settings=ALWAYS)  # fmt: skip
    if interleaved:
        assert sliced == [] and [c for c in routed if c is not None][:2] == [(0, 2), (1, 2)]
    else:
        assert sliced == [(0, 4), (4, 4)] and all(c is None for c in routed)
    assert _rel(got, nvfp4_fused_moe_reference(x, *layer.args(), w, ids)) < 1e-2


@pytest.mark.parametrize("chains", [2, 4])
def test_interleaved_chains_in_turn_match_the_reference_and_one_chain(chains, gen, device, monkeypatch):
    # Each chain over every n-th active expert (``interleaved_tokens_per_expert`` at or above the call's size): the
    # whole weights, no group slices, active experts 1, 2 and 6 of 8 (so that halves would give the first half two and
    # the second one), remote slots.
    layer, x, w, ids, args, kwargs = _three_tokens(gen, device)
    one = fused_moe(*args, **kwargs, settings=ONE)
    sliced, routed = _spy_shares(monkeypatch)
    two = fused_moe(*args, **kwargs, settings=chained(chains=chains, interleaved_tokens_per_expert=float("inf")))
    assert sliced == [], "interleaved chains read the whole weights"
    assert [c for c in routed if c is not None][:chains] == [(c, chains) for c in range(chains)]
    want = nvfp4_fused_moe_reference(x, *layer.args(), w, ids)
    assert _rel(one, want) < 1e-2 and _rel(two, want) < 1e-2
    assert torch.equal(two, one)  # one chain's K splits: its bits


def _three_tokens(gen, device):
    """A layer of 8 experts (H = 128, I = 1280) and three tokens over experts 1, 2 and 6 with remote slots: (layer, x,
    topk weights, ids, the op's arguments on ``device``, its keywords)."""
    layer, weights = _layer(gen, device, num_experts=8, hidden=128)
    x = torch.randn(3, 128, generator=gen).bfloat16()
    w, _ = random_routing(3, 8, 2, gen)
    ids = torch.tensor([[1, 6], [2, -1], [-1, 1]], dtype=torch.int32)
    args = (x.to(device), weights, w.to(device), ids.to(device))
    return layer, x, w, ids, args, {"check_ids": False, "num_global_experts": 64}


def _lookup_gemm2(device: torch.device):
    from sglang_glm5 import autotune

    return autotune.pick_config("w4a16", 6 / 64, 8, 128, 1280, device).gemm2


def _gpu(device: torch.device) -> None:
    if not torch.cuda.is_available() or device.type != "cuda":
        pytest.skip("two chains need CUDA streams (SGLANG_GLM5_TEST_DEVICE=cuda)")


# I = 1280 is at least five K steps of any tile the lookup may give (block_k <= 256), so gemm2 walks one N tile a
# program, where the op takes two chains (as at GLM-5 EP8, I = 2048)
def _layer(gen, device, num_experts=32, hidden=512, inter=1280):
    layer = random_layer(num_experts, hidden, inter, gen)
    return layer, Nvfp4MoeWeights.build(*(a.to(device) for a in layer.args())).for_device()


def _spy_shares(monkeypatch) -> tuple[list, list]:
    """What the op's chains took, call by call: the (first, count) of each group of experts it sliced off the weights,
    and the ``chain`` argument of each routing launch (None for a routing of one chain or of a group)."""
    sliced, routed = [], []
    group, route = w4a16._expert_group, w4a16.route_pairs
    monkeypatch.setattr(w4a16, "_expert_group", lambda *a: sliced.append(a[1:]) or group(*a))
    monkeypatch.setattr(w4a16, "route_pairs", lambda *a, **k: routed.append(k.get("chain")) or route(*a, **k))
    return sliced, routed


def _count_forks(monkeypatch) -> list:
    """The GPUs the op forked its second chain onto, call by call."""
    forks = []
    side = w4a16._side_streams

    def spy(index, chains, main):
        forks.extend([index] * (chains - 1))
        return side(index, chains, main)

    monkeypatch.setattr(w4a16, "_side_streams", spy)
    return forks


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want.cpu().double()).norm() / want.cpu().double().norm()).item()


# Tokens of an EP8-like rank (32 of 256 global experts, most slots remote): 1 and 2 tokens route each pair to a block
# of its own, 16 split K, 64 and 256 fill gemm2 into gemm1's last wave. Two chains as shipped, four and eight.
# "interleaved": each chain over every n-th active expert.
@pytest.mark.parametrize("num_tokens,chains,experts", [
    (1, 2, "halves"), (2, 2, "halves"), (16, 2, "halves"), (64, 2, "halves"), (256, 2, "halves"), (2, 4, "halves"),
    (16, 4, "halves"), (16, 8, "halves"), (64, 8, "halves"),
    (2, 2, "interleaved"), (16, 2, "interleaved"), (256, 2, "interleaved"), (16, 4, "interleaved"),
])  # fmt: skip
def test_chains_match_the_reference_and_one_chain(num_tokens, chains, experts, gen, device, monkeypatch):
    _gpu(device)
    settings = chained(chains=chains, interleaved_tokens_per_expert=INTERLEAVED[experts])
    layer, weights = _layer(gen, device)
    x = torch.randn(num_tokens, 512, generator=gen).bfloat16()
    w, ids = random_routing(num_tokens, 32, 8, gen, remote_fraction=0.875)
    ids[0, 0] = 3  # at least one local slot in each half
    ids[0, 1] = 20
    args = (x.to(device), weights, w.to(device), ids.to(device))
    kwargs = {"check_ids": False, "num_global_experts": 256}
    one = fused_moe(*args, **kwargs, settings=ONE)
    forks = _count_forks(monkeypatch)
    two = fused_moe(*args, **kwargs, settings=settings)
    again = fused_moe(*args, **kwargs, settings=settings)
    torch.cuda.synchronize()
    assert len(forks) == 2 * (chains - 1), "the op ran another number of chains"
    want = nvfp4_fused_moe_reference(x, *layer.args(), w, ids)
    assert _rel(one, want) < 1e-2
    assert _rel(two, want) < 1e-2
    assert torch.equal(two, one)  # one chain's K splits: its bits
    assert torch.equal(two, again)  # but the same call, the same bits


@pytest.mark.parametrize("chains,experts", [(2, "halves"), (4, "halves"), (8, "halves"), (2, "interleaved"),
                                            (4, "interleaved")])  # fmt: skip
def test_chains_replay_from_a_cuda_graph_with_other_routings(chains, experts, gen, device, monkeypatch):
    # A capture with the later chains forked onto their own streams, replayed with one expert active, then every
    # expert of every group, then one expert of the second half only (interleaved: the chains' experts change with
    # each routing, counted on the GPU).
    _gpu(device)
    settings = chained(chains=chains, interleaved_tokens_per_expert=INTERLEAVED[experts])
    layer, weights = _layer(gen, device)
    num_tokens, top_k = 8, 8
    x = torch.empty(num_tokens, 512, dtype=torch.bfloat16, device=device)
    tw = torch.empty(num_tokens, top_k, device=device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=device)

    def fill(routing: str) -> None:
        w, i = random_routing(num_tokens, 32, top_k, gen)
        if routing == "one expert":
            i = torch.full_like(i, -1)
            i[0, 0] = 5
        elif routing == "second half only":
            i = torch.full_like(i, -1)
            i[:, 0] = 17
        x.copy_(torch.randn(num_tokens, 512, generator=gen).bfloat16())
        tw.copy_(w)
        ids.copy_(i)

    fill("all")
    kwargs = {"check_ids": False, "num_global_experts": 256, "settings": settings}
    fused_moe(x, weights, tw, ids, **kwargs)  # compile outside the capture
    torch.cuda.synchronize()
    forks = _count_forks(monkeypatch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, weights, tw, ids, **kwargs)
    assert forks, "the op ran one chain"
    for routing in ("one expert", "all", "second half only"):
        fill(routing)
        graph.replay()
        torch.cuda.synchronize()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), tw.cpu(), ids.cpu())
        assert _rel(out, want) < 1e-2, routing


def test_the_chains_streams_differ_from_the_callers_and_from_one_another(device, monkeypatch):
    # A cached stream that happens to be the caller's (torch's pool of 32 comes round) is replaced, not forked onto
    _gpu(device)
    main = torch.cuda.current_stream(device)
    index = main.device.index
    monkeypatch.setattr(w4a16, "_SIDE_STREAMS", {(index, 1): main, (index, 2): main})
    streams = w4a16._side_streams(index, 4, main)
    assert len(streams) == 3 and main not in streams
    assert len({s.cuda_stream for s in streams}) == 3
    assert w4a16._side_streams(index, 4, main) == streams  # made once


def test_a_chunked_size_keeps_one_chain(gen, device, monkeypatch):
    _gpu(device)
    forks = []
    monkeypatch.setattr(w4a16, "_side_streams", lambda index, chains, main: forks.append(index) or [])
    assert w4a16_plan.expert_groups(CHUNKED_ROUTE_PAIRS, 32, 32, False, 1, ALWAYS) == 1
    _, weights = _layer(gen, device, num_experts=8, hidden=256, inter=128)
    tokens = CHUNKED_ROUTE_PAIRS // 2
    w, ids = random_routing(tokens, 8, 2, gen)
    x = torch.randn(tokens, 256, generator=gen).bfloat16()
    fused_moe(x.to(device), weights, w.to(device), ids.to(device), check_ids=False, path="w4a16", settings=ALWAYS)
    assert not forks


def _plan(pairs, experts, hidden, inter, sms, cfg=None, settings=ALWAYS) -> w4a16_plan.CallPlan:
    from sglang_glm5.variants.w4a16_tiles import heuristic_config

    cfg = cfg or heuristic_config(pairs / 256)
    return w4a16_plan.plan_call(cfg, pairs, experts, 256, hidden, inter, torch.device("cpu"), torch.bfloat16,
                                "checkpoint", sms, settings)  # fmt: skip


# A chain's own share (half the experts on half the SMs) would split K otherwise than one chain here: the test layer
# above (8 experts, H = 128, I = 1280) on the interpreter's 8 SMs, gemm2 5 splits against 3.
@pytest.mark.parametrize("pairs,experts,hidden,inter,sms", [(6, 8, 128, 1280, 8), (2, 32, 512, 1280, 8)])
def test_a_chain_keeps_one_chains_k_splits(pairs, experts, hidden, inter, sms):
    from sglang_glm5.variants.w4a16_tiles import heuristic_config

    cfg = heuristic_config(pairs / 256)
    own = w4a16_plan.plan_gemms(cfg, pairs, experts // 2, 256, hidden, inter, w4a16_plan.chain_sms(sms, 2))
    whole = w4a16_plan.plan_gemms(cfg, pairs, experts, 256, hidden, inter, sms)
    assert (own.gemm1.splits, own.gemm2.splits) != (whole.gemm1.splits, whole.gemm2.splits), "a case that differs"
    plan = _plan(pairs, experts, hidden, inter, sms, cfg)
    assert plan.chains == 2 and plan.alone is not None and plan.alone.chains == 1 and plan.alone.alone is None
    for gemm in ("gemm1", "gemm2"):
        chain, alone, want = getattr(plan.gemms, gemm), getattr(plan.alone.gemms, gemm), getattr(whole, gemm)
        assert (chain.splits, chain.k_per_split) == (alone.splits, alone.k_per_split) == (want.splits, want.k_per_split)
    assert plan.alone == _plan(pairs, experts, hidden, inter, sms, cfg).alone
    assert plan.alone == _plan(pairs, experts, hidden, inter, sms, cfg, ONE), "alone is the plan of one chain"


def test_a_stream_k_gemm1_keeps_one_chain():
    # its segments follow its program count and the blocks in use: a chain could not sum in one chain's order
    from sglang_glm5.tiles import GemmConfig, MoeConfig

    tile = GemmConfig(16, 64, 256, num_warps=4, num_stages=3)
    stream = MoeConfig(GemmConfig(16, 64, 256, num_warps=4, num_stages=3, stream=2), tile)
    assert _plan(64, 32, 6144, 2048, 132, MoeConfig(tile, tile)).chains == 2
    plan = _plan(64, 32, 6144, 2048, 132, stream)
    assert plan.gemms.gemm1.stream and plan.chains == 1 and plan.alone is None


def test_eager_calls_run_the_chains_once_then_one_chain(gen, device, monkeypatch):
    # The first eager call of a chained plan runs the chains (their kernels compiled and loaded for a later capture),
    # every later one one chain with the same K splits: the same bits. ``eager_chains``: the chains every time.
    # EAGER_GLOBAL experts: a call no other test makes, so that its first call in the session is this test's.
    settings = chained(eager_chains=False, interleaved_tokens_per_expert=float("inf"))
    layer, x, w, ids, args, kwargs = _three_tokens(gen, device)
    kwargs["num_global_experts"] = EAGER_GLOBAL
    _, routed = _spy_shares(monkeypatch)
    first = fused_moe(*args, **kwargs, settings=settings)
    assert routed == [(0, 2), (1, 2)], "the first call: both chains"
    later = [fused_moe(*args, **kwargs, settings=settings) for _ in range(2)]
    assert routed[2:] == [(0, 1), (0, 1)], "later calls: one chain each"
    assert all(torch.equal(first, got) for got in later)
    every = dataclasses.replace(settings, eager_chains=True)
    assert torch.equal(fused_moe(*args, **kwargs, settings=every), first) and routed[4:] == [(0, 2), (1, 2)]
    assert _rel(first, nvfp4_fused_moe_reference(x, *layer.args(), w, ids)) < 1e-2


def test_a_capture_after_eager_calls_runs_the_chains(gen, device, monkeypatch):
    # SGLang's order: a batch size run eagerly (here twice), then captured. The capture runs the chains, whose kernels
    # the first eager call loaded; the replay gives the eager calls' bits.
    _gpu(device)
    layer, weights = _layer(gen, device)
    w, ids = random_routing(8, 32, 8, gen, remote_fraction=0.5)
    x = torch.randn(8, 512, generator=gen).bfloat16()
    args = (x.to(device), weights, w.to(device), ids.to(device))
    # EAGER_GLOBAL experts: a call no other test makes, so that its first call in the session is this test's
    kwargs = {"check_ids": False, "num_global_experts": 4 * EAGER_GLOBAL, "settings": chained(eager_chains=False)}
    forks = _count_forks(monkeypatch)
    eager = [fused_moe(*args, **kwargs) for _ in range(2)]
    assert len(forks) == 1, "the first eager call forks the second chain, the second runs one"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(*args, **kwargs)
    assert len(forks) == 2, "the capture runs the chains"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager[0]) and torch.equal(out, eager[1])
    assert _rel(out, nvfp4_fused_moe_reference(x, *layer.args(), w, ids)) < 1e-2


def test_a_fresh_process_captures_the_chains_after_one_eager_call(device):
    # In a process whose Triton has loaded no kernel yet, one eager call of a chained shape must leave the chains'
    # kernels loaded: a capture cannot load one ("operation not permitted when stream is capturing").
    import subprocess
    import sys

    _gpu(device)
    script = """
import torch
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.variants.w4a16_plan import PlanSettings
from sglang_glm5.weights import Nvfp4MoeWeights
gen = torch.Generator().manual_seed(5)
layer = random_layer(32, 512, 1280, gen)
weights = Nvfp4MoeWeights.build(*(a.cuda() for a in layer.args())).for_device()
w, ids = random_routing(8, 32, 8, gen, remote_fraction=0.5)
args = (torch.randn(8, 512, generator=gen).bfloat16().cuda(), weights, w.cuda(), ids.cuda())
kwargs = {"check_ids": False, "num_global_experts": 256, "settings": PlanSettings(chains_tokens_per_expert=(0, 8))}
eager = fused_moe(*args, **kwargs)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = fused_moe(*args, **kwargs)
graph.replay()
torch.cuda.synchronize()
assert torch.equal(out, eager)
print("captured")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "captured" in done.stdout, done.stderr[-2000:]


def test_a_chain_keeps_one_chains_gemm2_tiles_a_program():
    # TP8-like (I = 256: gemm2 several N tiles a program) on 81 SMs: a chain's own share (40 SMs) would keep two tiles
    # a program where one chain keeps one, and only one chain's may split K
    from sglang_glm5.variants.w4a16_tiles import heuristic_config

    cfg = heuristic_config(8 / 256)
    whole = w4a16_plan.plan_gemms(cfg, 8, 256, 256, 6144, 256, 81, settings=SHIPPED)
    own = w4a16_plan.plan_gemms(cfg, 8, 128, 256, 6144, 256, w4a16_plan.chain_sms(81, 2), settings=SHIPPED)
    assert own.per_program != whole.per_program, "a case that differs"
    share = w4a16_plan.plan_gemms(cfg, 8, 128, 256, 6144, 256, w4a16_plan.chain_sms(81, 2), like=whole,
                                  settings=SHIPPED)  # fmt: skip
    assert share.per_program == whole.per_program
    assert (share.gemm2.splits, share.gemm2.k_per_split) == (whole.gemm2.splits, whole.gemm2.k_per_split)


# Global experts of the calls of the tests of the eager rule (or twice, four times as many): no other test's calls, so
# that a call's first in the session (``w4a16._eager_plan``) is the test's own, whatever ran before.
EAGER_GLOBAL = 37


def _tokens(gen, device, num_tokens):
    """``_three_tokens``' layer with ``num_tokens`` tokens over experts 1, 2 and 6: (x, topk weights, ids) on device."""
    x = torch.randn(num_tokens, 128, generator=gen).bfloat16()
    w, _ = random_routing(num_tokens, 8, 2, gen)
    ids = torch.tensor([[1, 6], [2, -1], [-1, 1], [6, 2], [1, -1], [2, 6]][:num_tokens], dtype=torch.int32)
    return x.to(device), w.to(device), ids.to(device)


def test_each_call_runs_the_chains_eagerly_once_even_where_plans_are_equal(gen, device, monkeypatch):
    # T = 5 and 6 on the test layer get equal plans, but Triton specializes the chains' kernels on their sizes: T = 6's
    # first eager call must run (and load) its own chains. A first call that raised records nothing.
    from sglang_glm5.variants.w4a16_tiles import heuristic_config

    # 2 * EAGER_GLOBAL experts: calls no other test makes, so that their first calls in the session are this test's
    settings = chained(eager_chains=False, interleaved_tokens_per_expert=float("inf"))
    num_global = 2 * EAGER_GLOBAL

    def plan(tokens):
        return w4a16_plan.plan_call(heuristic_config(tokens * 2 / num_global), tokens * 2, 8, num_global, 128, 1280,
                                    device, torch.bfloat16, "checkpoint", w4a16_plan.sm_count(device.index),
                                    settings)  # fmt: skip

    assert plan(5) == plan(6) and plan(5).chains == 2
    _, weights = _layer(gen, device, num_experts=8, hidden=128)
    kwargs = {"check_ids": False, "num_global_experts": num_global, "settings": settings}
    _, routed = _spy_shares(monkeypatch)
    five, six = _tokens(gen, device, 5), _tokens(gen, device, 6)
    for args in (five, five, six, six):
        fused_moe(args[0], weights, *args[1:], **kwargs)
    assert routed == [(0, 2), (1, 2), (0, 1), (0, 2), (1, 2), (0, 1)]
    four = _tokens(gen, device, 4)
    launch, failed = w4a16.launch_gemm2, []

    def fail_once(*a, **k):
        if not failed:
            failed.append(True)
            raise RuntimeError("a launch that failed")
        return launch(*a, **k)

    monkeypatch.setattr(w4a16, "launch_gemm2", fail_once)
    with pytest.raises(RuntimeError, match="a launch that failed"):
        fused_moe(four[0], weights, *four[1:], **kwargs)
    del routed[:]
    fused_moe(four[0], weights, *four[1:], **kwargs)
    assert routed == [(0, 2), (1, 2)], "after a call that raised, the next one runs the chains"
