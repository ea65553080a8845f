"""Split-K, the block-program loop and the stream-K gemm1 of the W4A16 kernels: decode with few active experts.

At decode a rank under expert parallelism sees a handful of active experts, so the op splits the K
loop of each GEMM over several programs (``w4a16_plan.plan_launch``) and sizes the grid for the blocks it
expects rather than for the upper bound, or runs gemm1 as a stream-K schedule (``GemmConfig.stream``): a fixed
number of persistent programs share the K steps of every used (block, N tile) equally, and the last program of a
cut tile adds its fp32 partials in program order. These tests pin the results against the float64 reference,
bit-identity across runs, and that a split result does not depend on which program finishes last.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from sglang_glm5 import env, hardware, moe, routing
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16, w4a16_plan, w4a16_tiles
from sglang_glm5.weights import Nvfp4MoeWeights

SHIPPED = w4a16_plan.PlanSettings()  # the plan's defaults, whatever the environment holds


@dataclass(frozen=True)
class Case:
    num_tokens: int
    active: int  # distinct local experts that receive pairs; every other slot is -1 (another rank)
    num_experts: int = 8
    hidden: int = 512
    inter: int = 256
    top_k: int = 4
    idle: int = 0  # tokens with no local slot (all top-k experts on other ranks)


CASES = [
    Case(1, active=1),  # EP decode at concurrency 1: one local expert, the rest of the slots remote
    Case(2, active=2),  # two tokens on two experts
    Case(5, active=8),  # every local expert active, some slots remote
    Case(3, active=1, hidden=544, inter=160),  # masked K tails in both GEMMs (544 = 4.25 steps of 128)
    Case(6, active=2, idle=3),  # half the tokens have no local slot: their rows of the result are 0
]


def _routing(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    weights, _ = random_routing(case.num_tokens, case.num_experts, case.top_k, gen)
    experts = torch.randperm(case.num_experts, generator=gen)[: case.active]
    ids = torch.full((case.num_tokens, case.top_k), -1, dtype=torch.int32)
    for t in range(case.idle, case.num_tokens):  # each token: one to top_k of the active experts, distinct
        n = int(torch.randint(1, min(case.top_k, case.active) + 1, (1,), generator=gen))
        pick = experts[torch.randperm(case.active, generator=gen)[:n]]
        slots = torch.randperm(case.top_k, generator=gen)[:n]
        ids[t, slots] = pick.to(torch.int32)
    return weights, ids


def _inputs(case: Case, gen: torch.Generator, device: torch.device):
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16()
    weights, ids = _routing(case, gen)
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    return layer, x, weights, ids, want, [a.to(device) for a in (x, *layer.args(), weights, ids)]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).norm() / want.norm()).item()


def _stream_config(per_sm: int) -> MoeConfig:
    """The heuristic's decode tiles with gemm1 as a stream-K schedule of ``per_sm`` programs per SM."""
    cfg = w4a16_tiles.heuristic_config(1)
    return MoeConfig(dataclasses.replace(cfg.gemm1, stream=per_sm), cfg.gemm2)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"T{c.num_tokens}-active{c.active}-idle{c.idle}-H{c.hidden}-I{c.inter}"
)
def test_op_with_few_active_experts_matches_float64_reference(case, gen, device):
    _, _, _, ids, want, args = _inputs(case, gen, device)
    sms = w4a16_plan.sm_count(None if device.type == "cpu" else device.index or 0)
    cfg = w4a16_tiles.heuristic_config(1)
    bound = routing.num_blocks_bound(ids.numel(), case.num_experts, cfg.gemm1.block_m)
    # As under 8-way expert parallelism: the op expects few local blocks from T * k / (8 E) pairs.
    expected = w4a16_plan.expected_blocks(ids.numel(), case.num_experts, 8 * case.num_experts, cfg.gemm1.block_m)
    tiles = -(-case.inter // cfg.gemm1.block_n)
    launch = w4a16_plan.plan_launch(case.hidden, cfg.gemm1, tiles, bound, min(bound, expected), sms)
    if device.type == "cpu":
        assert launch.splits > 1, "the interpreter's small GPU should make the op split gemm1's K"
    out = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts)
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-2
    again = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts)
    assert torch.equal(out, again), "the same call twice must give the same bits"


@pytest.mark.parametrize("splits", [3, 5])  # 10 K steps of gemm1: the last split shorter, then all equal
def test_split_gemms_match_the_unsplit_ones_and_repeat_bit_for_bit(splits, gen, device):
    # gemm1 split in K: the last program of a tile adds the fp32 partials in split order; gemm2 split in
    # K: fp32 partials that sum_over_slots adds. Each against the unsplit launch (close: the fp32 sums
    # are grouped differently) and against itself (identical bits).
    case = Case(3, active=2, hidden=640, inter=384)
    layer, x, weights, ids, _, _ = _inputs(case, gen, device)
    cfg = GemmConfig(16, 64, 64)
    w13, s13, g13, w2, s2, g2 = (t.to(device) for t in layer.args())
    ids_d = ids.to(device)
    xp = routing.prepare_activations(x.to(device))
    tiles1 = -(-case.inter // cfg.block_n)

    def gemm1(n: int) -> torch.Tensor:
        bound = routing.num_blocks_bound(ids.numel(), case.num_experts, cfg.block_m)
        counters = torch.full((bound * tiles1,), 7, dtype=torch.int32, device=device)  # the route zeroes them
        route = routing.route_pairs(ids_d, case.num_experts, cfg.block_m, zero=counters)
        launch = w4a16_plan.Launch(1, *w4a16_plan.k_splits(case.hidden, cfg.block_k, n))
        h = torch.full((ids.numel(), case.inter), float("nan"), dtype=torch.bfloat16, device=device)
        w4a16.launch_gemm1(xp, w13, s13, g13, route, h, cfg, case.top_k, 0, case.inter, routing.interpreting(),
                         launch=launch if n > 1 else None, counters=counters)  # fmt: skip
        return h

    def gemm2(n: int, h: torch.Tensor) -> torch.Tensor:
        route = routing.route_pairs(ids_d, case.num_experts, cfg.block_m)
        launch = w4a16_plan.Launch(2, *w4a16_plan.k_splits(case.inter, cfg.block_k, n))
        n = launch.splits
        shape = (n, ids.numel(), case.hidden) if n > 1 else (ids.numel(), case.hidden)
        y = torch.full(shape, float("nan"), dtype=torch.float32 if n > 1 else torch.bfloat16, device=device)
        w4a16.launch_gemm2(h, w2, s2, g2, weights.reshape(-1).to(device), route, y, cfg, routing.interpreting(),
                         per_program=1, launch=launch)  # fmt: skip
        out = torch.empty(case.num_tokens, case.hidden, dtype=torch.bfloat16, device=device)
        routing.sum_over_slots(y, ids_d, out, case.num_experts, routing.interpreting())
        return out

    valid = (ids.reshape(-1) >= 0).to(device)
    h1, hs = gemm1(1), gemm1(splits)
    assert not h1[valid].isnan().any() and not hs[valid].isnan().any(), "every local pair's row is written"
    assert _rel(hs[valid], h1[valid].cpu().double()) < 1e-2
    assert torch.equal(hs[valid], gemm1(splits)[valid])
    o1, os_ = gemm2(1, h1), gemm2(splits, h1)
    assert _rel(os_, o1.cpu().double()) < 1e-2
    assert torch.equal(os_, gemm2(splits, h1))
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    assert _rel(gemm2(splits, hs), want) < 1e-2


def test_plan_splits_only_when_the_blocks_leave_programs_idle():
    # 132 SMs, K = 6144 in steps of 256 (24 steps), 32 N tiles: one active block splits, 64 blocks do not.
    cfg = GemmConfig(16, 128, 256)
    few = w4a16_plan.plan_launch(6144, cfg, 32, blocks_bound=9, blocks_expected=1.0, sms=132)
    many = w4a16_plan.plan_launch(6144, cfg, 32, blocks_bound=96, blocks_expected=64.0, sms=132)
    assert few.splits > 1 and few.k_per_split % 256 == 0 and few.splits * few.k_per_split >= 6144
    assert (few.splits - 1) * few.k_per_split < 6144, "no split is empty"
    assert many.splits == 1 and many.block_programs == 96
    assert few.block_programs == 4, "twice the expected blocks and two more, within the bound"
    assert w4a16_plan.plan_launch(6144, cfg, 32, 9, 1.0, 132, split=False).splits == 1
    fixed = GemmConfig(16, 128, 256, split_k=5)  # a tuned split count: 24 steps in 5 splits of 5 (the last 4)
    assert w4a16_plan.plan_launch(6144, fixed, 32, 96, 64.0, 132) == w4a16_plan.Launch(96, 5, 1280)
    assert w4a16_plan.k_splits(384, 64, 5) == (3, 128), "6 steps in at most 5 splits: 3 of 2 steps, none empty"


def test_plan_takes_the_whole_grid_when_few_blocks_would_idle():
    # At decode the bound on blocks may be close to the blocks expected (GLM-5 EP8 B = 8: 35 against 7.6): then a
    # program per possible block (no block loop), the block axis last when the launch splits. Far from it (B = 1:
    # 9 against 1.05), the block loop as before; and never without ``whole_grid_within`` (which plan_gemms gives only
    # up to WHOLE_GRID_PAIRS_PER_EXPERT: GLM-5 EP8 B = 256 takes the whole grid, B = 257 the block loop).
    cfg = GemmConfig(16, 64, 256)
    near = w4a16_plan.plan_launch(6144, cfg, 8, 35, 7.6, 132, whole_grid_within=5.0)
    assert near.block_programs == 35 and near.splits > 1 and near.blocks_last
    unsplit = w4a16_plan.plan_launch(6144, cfg, 8, 35, 7.6, 132, split=False, whole_grid_within=5.0)
    assert unsplit.block_programs == 35 and unsplit.splits == 1 and not unsplit.blocks_last
    far = w4a16_plan.plan_launch(6144, cfg, 8, 9, 1.05, 132, whole_grid_within=5.0)
    assert far.block_programs == 5 and not far.blocks_last
    loop = dataclasses.replace(near, block_programs=18, blocks_last=False)
    assert w4a16_plan.plan_launch(6144, cfg, 8, 35, 7.6, 132) == loop
    glm5 = MoeConfig(GemmConfig(16, 128, 256), GemmConfig(16, 128, 256))
    for batch, whole in ((256, True), (257, False)):
        plan = w4a16_plan.plan_gemms(glm5, batch * 8, 32, 256, 6144, 2048, 132)
        bound = routing.num_blocks_bound(batch * 8, 32, 16)
        assert (plan.gemm1.block_programs == bound) == whole and (plan.gemm2.block_programs == bound) == whole, batch


def test_whole_grid_gives_the_block_loops_bits(gen, device, monkeypatch):
    # The same call planned with a program per possible block (the block axis last) and with block loops: the same
    # splits and K ranges, so the same bits; and both right against float64.
    case = Case(5, active=8)  # 20 pairs over 64 global experts: 9 possible blocks, 2.2 expected
    _, _, _, ids, want, args = _inputs(case, gen, device)
    sms = w4a16_plan.sm_count(None if device.type == "cpu" else device.index or 0)
    cfg = w4a16_tiles.heuristic_config(1)
    plan = w4a16_plan.plan_gemms(cfg, ids.numel(), case.num_experts, 8 * case.num_experts, case.hidden, case.inter, sms,
                                 settings=SHIPPED)  # fmt: skip
    bound = routing.num_blocks_bound(ids.numel(), case.num_experts, cfg.gemm1.block_m)
    assert plan.gemm1.block_programs == bound and plan.gemm1.blocks_last == (plan.gemm1.splits > 1)
    if device.type == "cpu":
        assert plan.gemm1.blocks_last, "the interpreter's small GPU should make the op split gemm1's K"
    whole = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts, settings=SHIPPED)
    loops = dataclasses.replace(SHIPPED, whole_grid_within=0.0)
    assert w4a16_plan.plan_gemms(cfg, ids.numel(), case.num_experts, 8 * case.num_experts, case.hidden, case.inter,
                                 sms, settings=loops).gemm1.block_programs < bound  # fmt: skip
    looped = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts, settings=loops)
    assert torch.equal(whole, looped)
    assert _rel(whole, want) < 1e-2


def test_gemm2_halves_give_the_one_tile_bits(gen, device, monkeypatch):
    # gemm2's 128-row tile as two halves of 64 rows (w4a16_plan.halves): each output row sums the same products in the
    # same order, so the same bits; H = 320 leaves the last tile's second half out of range.
    layer = random_layer(4, 320, 192, gen)
    weights, ids = random_routing(5, 4, 2, gen)
    x = torch.randn(5, 320, generator=gen).bfloat16()
    cfg = MoeConfig(GemmConfig(16, 64, 64), GemmConfig(16, 128, 128))
    assert w4a16_plan.halves(cfg.gemm2, 1) and not w4a16_plan.halves(cfg.gemm2, 2)
    assert not w4a16_plan.halves(GemmConfig(16, 128, 128, num_warps=8), 1), "8 warps: a half would give a wgmma 32 rows"
    # 64-deep steps: a half's decode pairs words of two scale blocks on sm_90 (w4a16_pairs)
    assert not w4a16_plan.halves(GemmConfig(16, 128, 64), 1)
    ids_d = ids.to(device)
    w13, s13, g13, w2, s2, g2 = (t.to(device) for t in layer.args())
    route = routing.route_pairs(ids_d, 4, 16)
    h = torch.empty(ids.numel(), 192, dtype=torch.bfloat16, device=device)
    xp = routing.prepare_activations(x.to(device))
    w4a16.launch_gemm1(xp, w13, s13, g13, route, h, cfg.gemm1, 2, 0, 192, routing.interpreting())

    def gemm2(halves: bool) -> torch.Tensor:
        y = torch.full((ids.numel(), 320), float("nan"), dtype=torch.bfloat16, device=device)
        w4a16.launch_gemm2(h, w2, s2, g2, weights.reshape(-1).to(device), route, y, cfg.gemm2, routing.interpreting(),
                           per_program=1, halves=halves)  # fmt: skip
        out = torch.empty(5, 320, dtype=torch.bfloat16, device=device)
        routing.sum_over_slots(y, ids_d, out, 4, routing.interpreting())
        return out

    split = gemm2(True)
    assert torch.equal(split, gemm2(False))
    assert _rel(split, nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)) < 1e-2


def test_a_launch_with_an_empty_split_is_refused(gen, device):
    layer = random_layer(4, 256, 128, gen)
    weights, ids = random_routing(2, 4, 2, gen)
    cfg = GemmConfig(16, 64, 64)
    route = routing.route_pairs(ids.to(device), 4, cfg.block_m)
    y = torch.empty(3, ids.numel(), 256, device=device)
    h = torch.randn(ids.numel(), 128, generator=gen).bfloat16().to(device)
    with pytest.raises(ValueError, match="leaves a K split empty"):  # K = 128: two steps, not three
        w4a16.launch_gemm2(h, *(t.to(device) for t in layer.args()[3:]), weights.reshape(-1).to(device), route, y, cfg,
                         routing.interpreting(), per_program=1, launch=w4a16_plan.Launch(1, 3, 64))  # fmt: skip


def test_each_pair_routing_gives_a_block_per_valid_pair(gen, device):
    # Two tokens share expert 3, one slot is remote (-1), one id is past E (dropped): six valid pairs in pair order.
    ids = torch.tensor([[3, -1, 0, 5], [3, 7, 9, 1]], dtype=torch.int32, device=device)
    block_m = 16
    route = routing.route_pairs(ids, 8, block_m, each_pair=True)
    valid = [p for p, e in enumerate(ids.reshape(-1).tolist()) if 0 <= e < 8]
    blocks = routing.num_blocks_bound(ids.numel(), 8, block_m)
    assert int(route.used_blocks) == len(valid) == 6
    assert route.block_expert.tolist() == [ids.reshape(-1)[p].item() for p in valid] + [-1] * (blocks - 6)
    sorted_ids = route.sorted_ids.view(blocks, block_m).cpu()
    assert sorted_ids[:6, 0].tolist() == valid
    padding = torch.ones_like(sorted_ids, dtype=torch.bool)
    padding[:6, 0] = False
    assert (sorted_ids[padding] == ids.numel()).all()
    with pytest.raises(ValueError, match="each_pair"):
        routing.route_pairs(torch.zeros(3, 4, dtype=torch.int32, device=device), 8, block_m, each_pair=True)


@pytest.mark.parametrize("num_tokens, idle", [(1, 0), (2, 0), (4, 1), (2, 2)])
def test_each_pair_routing_gives_the_sorted_routings_bits(num_tokens, idle, gen, device, monkeypatch):
    # At most PlanSettings.each_pair_max_pairs pairs the op routes each pair to a block of its own (no sort); a pair's
    # row is the same sums either way. Four tokens over three active experts share experts across tokens; idle tokens
    # have no local slot (their rows are 0), and with (2, 2) no pair is valid at all.
    case = Case(num_tokens, active=3, num_experts=16, idle=idle)
    assert num_tokens * case.top_k <= min(SHIPPED.each_pair_max_pairs, case.num_experts)
    _, _, _, _, want, args = _inputs(case, gen, device)
    taken = []
    route = w4a16.route_pairs
    monkeypatch.setattr(w4a16, "route_pairs", lambda *a, **k: taken.append(k["each_pair"]) or route(*a, **k))
    each = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts, settings=SHIPPED)
    sorted_ = moe.nvfp4_fused_moe(*args, num_global_experts=8 * case.num_experts,
                                  settings=dataclasses.replace(SHIPPED, each_pair_max_pairs=0))  # fmt: skip
    assert taken == [True, False]
    assert torch.equal(each, sorted_)
    if idle == num_tokens:
        assert not each.any(), "no local slot: every row is 0"
    else:
        assert _rel(each, want) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("stream", [0, 2])  # the planned grid; gemm1 as a stream-K schedule of 2 programs per SM
@pytest.mark.parametrize("num_experts", [8, 16])  # 16 pairs: sorted by expert with 8, a block per pair with 16
def test_graph_replays_with_one_expert_then_all(num_experts, stream, gen, device):
    # A graph captured with one routing must stay right when the next step's routing is very different:
    # the grid and the splits are fixed at capture, the blocks in use come from the device.
    if device.type != "cuda":
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    config = _stream_config(stream) if stream else None
    case = Case(4, active=1, num_experts=num_experts, hidden=1024, inter=512)
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    args = [a.to(device) for a in layer.args()]
    x = torch.empty(case.num_tokens, case.hidden, dtype=torch.bfloat16, device=device)
    weights = torch.empty(case.num_tokens, case.top_k, device=device)
    ids = torch.empty(case.num_tokens, case.top_k, dtype=torch.int32, device=device)

    def fill(active: int):  # one token of four has no local slot
        w, i = _routing(Case(case.num_tokens, active, case.num_experts, case.hidden, case.inter, idle=1), gen)
        x.copy_(torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16())
        weights.copy_(w)
        ids.copy_(i)

    fill(1)
    moe.nvfp4_fused_moe(x, *args, weights, ids, config=config, check_ids=False, num_global_experts=64)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.nvfp4_fused_moe(x, *args, weights, ids, config=config, check_ids=False, num_global_experts=64)
    for active in (1, num_experts, 1):
        fill(active)
        graph.replay()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), weights.cpu(), ids.cpu())
        assert _rel(out, want) < 1e-2, f"{active} active experts"


def test_programmatic_dependent_launch_only_where_it_runs(monkeypatch):
    # griddepcontrol needs sm_90+; the interpreter and CPU tensors never use it; SGLANG_GLM5_PDL=0 turns it off.
    assert hardware.launches_dependents(90) and hardware.launches_dependents(120)
    assert not hardware.launches_dependents(80) and not hardware.launches_dependents(89)
    assert not routing.uses_pdl(torch.device("cpu"))
    monkeypatch.delenv("SGLANG_GLM5_PDL", raising=False)
    assert env.get(env.PDL) is True, "on unless turned off"
    monkeypatch.setenv("SGLANG_GLM5_PDL", "off")
    assert env.get(env.PDL) is False
    if torch.cuda.is_available() and not routing.interpreting():
        monkeypatch.setenv("SGLANG_GLM5_PDL", "0")
        assert not routing.uses_pdl(torch.device("cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="programmatic dependent launch needs a GPU")
def test_dependent_launches_in_a_graph_give_the_bits_of_plain_ones(gen, device, monkeypatch):
    # Each launch starting while the one before it runs must change nothing: every kernel waits for the
    # previous one before touching memory. Eagerly and replayed from a CUDA graph, against plain launches.
    if device.type != "cuda" or not routing.uses_pdl(device):
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not an sm_90+ GPU")
    case = Case(6, active=3, idle=1, num_experts=8, hidden=1024, inter=512)
    layer, x, weights, ids, want, _ = _inputs(case, gen, device)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    args = (x.to(device), bundle, weights.to(device), ids.to(device))
    kw = {"check_ids": False, "num_global_experts": 64}
    plain = moe.fused_moe(*args, **kw, settings=dataclasses.replace(SHIPPED, pdl=False))
    kw["settings"] = SHIPPED
    assert torch.equal(moe.fused_moe(*args, **kw), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(*args, **kw)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, plain)
    assert _rel(plain, want) < 1e-2


STREAM_CASES = [
    Case(1, active=1),  # one local expert: a few tiles shared by every program
    Case(2, active=2),  # two experts, two blocks
    Case(7, active=8),  # every local expert active, some slots remote
    Case(3, active=2, hidden=544, inter=160),  # masked K tail (544 = 4.25 steps of 128) and N tail
    Case(6, active=3, idle=3),  # half the tokens have no local slot: their rows are 0
]
# Stream programs per SM; the interpreter's GPU has 8 SMs (w4a16_plan.sm_count), so 8, 16 and 40 programs: fewer than
# the tiles, more than the K steps of a tile, some with no work at all.
PROGRAMS_PER_SM = [1, 2, 5]


@pytest.mark.parametrize("per_sm", PROGRAMS_PER_SM)
@pytest.mark.parametrize(
    "case", STREAM_CASES, ids=lambda c: f"T{c.num_tokens}-active{c.active}-idle{c.idle}-H{c.hidden}-I{c.inter}"
)
def test_stream_gemm1_matches_float64_reference_and_repeats(case, per_sm, gen, device):
    config = _stream_config(per_sm)
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16()
    weights, ids = _routing(case, gen)
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    args = [a.to(device) for a in (x, *layer.args(), weights, ids)]
    sms = w4a16_plan.sm_count(None if device.type == "cpu" else 0)
    plan = w4a16_plan.plan_gemms(
        config, ids.numel(), case.num_experts, 8 * case.num_experts, case.hidden, case.inter, sms
    )
    assert plan.gemm1.stream == per_sm * sms and plan.counters > 0, "the plan must take the stream-K schedule"
    out = moe.nvfp4_fused_moe(*args, config=config, num_global_experts=8 * case.num_experts)
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-2
    if case.idle:
        assert not out[: case.idle].any(), "tokens with no local slot get zeros"
    again = moe.nvfp4_fused_moe(*args, config=config, num_global_experts=8 * case.num_experts)
    assert torch.equal(out, again), "the same call twice must give the same bits"


def test_stream_gemm1_with_no_local_slot_writes_zeros(gen, device):
    # No used block: every program of the schedule has nothing to do, and the result is all zeros.
    case = Case(3, active=1, idle=3)
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16()
    weights, ids = _routing(case, gen)
    assert (ids < 0).all()
    args = [a.to(device) for a in (x, *layer.args(), weights, ids)]
    out = moe.nvfp4_fused_moe(*args, config=_stream_config(2), num_global_experts=8 * case.num_experts)
    assert out.shape == x.shape and not out.any()


def test_stream_only_where_a_config_asks_and_up_to_its_pair_limit():
    # GLM-5 EP8 shapes: 32 local experts of 256, H = 6144, I = 2048, on 132 SMs.
    assert w4a16_plan.plan_gemms(w4a16_tiles.heuristic_config(1), 8, 32, 256, 6144, 2048, 132).gemm1.stream == 0
    plan = w4a16_plan.plan_gemms(_stream_config(2), 8, 32, 256, 6144, 2048, 132)
    assert plan.gemm1 == w4a16_plan.Launch(plan.gemm1.block_programs, 1, 6144, stream=264)
    assert plan.counters == plan.gemm1.block_programs * 2048 // _stream_config(2).gemm1.block_n
    assert plan.gemm2 == w4a16_plan.plan_gemms(w4a16_tiles.heuristic_config(1), 8, 32, 256, 6144, 2048, 132).gemm2
    many = int(SHIPPED.stream_pairs_per_expert) * 256 + 8  # past the sizes where it was measured: the planned grid
    assert w4a16_plan.plan_gemms(_stream_config(2), many, 32, 256, 6144, 2048, 132).gemm1.stream == 0
    # programs x units past int32 (the kernel's unit arithmetic): the planned grid rather than a failed call
    wide = MoeConfig(GemmConfig(16, 16, 64, 4, 3, stream=8), w4a16_tiles.heuristic_config(1).gemm2)
    assert w4a16_plan.plan_gemms(wide, 2048, 256, 256, 65536, 2048, 132).gemm1.stream == 0
