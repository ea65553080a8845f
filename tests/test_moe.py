"""The public op against the float64 reference, through the Triton interpreter on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from sglang_glm5 import routing
from sglang_glm5.moe import nvfp4_fused_moe
from sglang_glm5.reference import align_pairs_by_expert_reference, nvfp4_fused_moe_reference
from sglang_glm5.routing import CHUNKED_ROUTE_PAIRS, align_pairs_by_expert, route_pairs
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16


@dataclass(frozen=True)
class Case:
    num_tokens: int
    num_experts: int = 8
    hidden: int = 256
    inter: int = 128
    top_k: int = 8
    remote_fraction: float = 0.0  # slots routed to experts on other ranks (-1)
    routing: str = "random"  # "random" | "one_expert" | "few_experts"
    w13_order: str = "gate_up"
    dtype: torch.dtype = torch.bfloat16
    scale_2_per_half: bool = True  # w13_scale_2 [E, 2] (else [E])
    config: MoeConfig | None = None


def _cfg(bm, bn, bk):
    c = GemmConfig(block_m=bm, block_n=bn, block_k=bk)
    return MoeConfig(c, c)


CASES = [
    Case(1, top_k=2),  # a single decode token
    Case(3, top_k=4),  # fewer pairs than experts: most experts get no token
    Case(17, top_k=8),  # odd token count, every slot used, blocks partly padded
    Case(64, top_k=8),  # a block_m=64 heuristic tile
    Case(17, top_k=8, remote_fraction=0.4),  # expert parallelism: -1 ids dropped
    Case(5, top_k=2, remote_fraction=1.0),  # a rank with no local pair at all: output is zero
    Case(33, top_k=1, routing="one_expert"),  # all tokens on one expert: several blocks of one expert
    Case(20, top_k=2, routing="few_experts"),  # experts with zero tokens between busy ones
    Case(17, top_k=4, w13_order="up_gate"),  # w13 rows [up; gate] (flashinfer_cutlass loading order)
    Case(9, top_k=3, dtype=torch.float16),  # fp16 activations
    Case(9, top_k=3, scale_2_per_half=False),  # one global scale for gate and up
    Case(11, num_experts=5, hidden=96, inter=160, top_k=3),  # K not a multiple of block_k (masked tail)
    Case(40, top_k=4, config=_cfg(32, 32, 64)),  # an explicit config, N split in several tiles
    Case(40, top_k=4, config=MoeConfig(GemmConfig(16, 64, 64), GemmConfig(64, 128, 128))),  # gemm-specific tiles
    # gemm2 with two K steps: 4 N tiles per program, 5 tiles over 2 programs (3 and 2): the multi-tile loop
    Case(13, hidden=160, inter=128, top_k=3, config=_cfg(16, 32, 64)),
    # gemm2 with 8 K steps: one N tile per program (every other case here has a short K loop)
    Case(9, hidden=64, inter=512, top_k=2, config=_cfg(16, 32, 64)),
    # one N tile per program with a masked K tail (544 = 8.5 steps of 64)
    Case(7, num_experts=5, hidden=96, inter=544, top_k=2, config=_cfg(16, 32, 64)),
]


def _routing(case: Case, gen: torch.Generator):
    weights, ids = random_routing(
        case.num_tokens, case.num_experts, case.top_k, gen, remote_fraction=case.remote_fraction
    )
    if case.routing == "one_expert":
        ids[:] = 3
    elif case.routing == "few_experts":
        ids = torch.where(ids % 3 == 0, ids, (ids // 3) * 3).to(torch.int32)
        ids[:, 1] = torch.where(ids[:, 0] == 6, 0, 6)  # two distinct experts per token
    return weights, ids


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"T{c.num_tokens}-E{c.num_experts}-H{c.hidden}-I{c.inter}-k{c.top_k}"
)
def test_matches_float64_reference(case: Case, gen, device):
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2 = layer.args()
    if case.w13_order == "up_gate":
        inter = case.inter
        w13 = torch.cat([w13[:, inter:], w13[:, :inter]], dim=1)
        w13_scale = torch.cat([w13_scale[:, inter:], w13_scale[:, :inter]], dim=1)
    if not case.scale_2_per_half:
        w13_scale_2 = w13_scale_2[:, 0].contiguous()
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).to(case.dtype)
    weights, ids = _routing(case, gen)
    args = (x, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, weights, ids)

    out = nvfp4_fused_moe(*(a.to(device) for a in args), w13_order=case.w13_order, config=case.config)
    ref = nvfp4_fused_moe_reference(*args, w13_order=case.w13_order)

    assert out.dtype == case.dtype and out.shape == (case.num_tokens, case.hidden)
    out = out.cpu().double()
    assert torch.isfinite(out).all()
    if ref.norm() == 0:  # no local pair: exactly zero
        assert torch.equal(out, torch.zeros_like(out))
        return
    rel = ((out - ref).norm() / ref.norm()).item()
    rms_rel = ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    max_rel = ((out - ref).abs().max() / ref.abs().max()).item()
    assert rel < 1e-2, f"relative error {rel:.2e} (rms {rms_rel:.2e}, max {max_rel:.2e})"
    assert max_rel < 3e-2, f"max relative error {max_rel:.2e}"


def test_deterministic(gen, device):
    layer = random_layer(8, 128, 64, gen)
    x = torch.randn(24, 128, generator=gen).bfloat16()
    weights, ids = random_routing(24, 8, 4, gen)
    args = [a.to(device) for a in (x, *layer.args(), weights, ids)]
    a = nvfp4_fused_moe(*args)
    b = nvfp4_fused_moe(*args)
    assert torch.equal(a, b)


def test_empty_batch_returns_empty_without_launch(gen, device):
    layer = random_layer(4, 64, 32, gen)
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    out = nvfp4_fused_moe(
        *(a.to(device) for a in (x, *layer.args(), torch.empty(0, 2), torch.empty(0, 2, dtype=torch.int32)))
    )
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "num_tokens,top_k,num_experts,block_m",
    [
        (1, 8, 32, 16), (3, 4, 8, 16), (64, 8, 8, 64), (700, 2, 5, 32), (0, 2, 4, 16), (37, 3, 257, 16),
        # prefill sizes: from CHUNKED_ROUTE_PAIRS pairs two launches over chunks of the ids, the last partial
        (CHUNKED_ROUTE_PAIRS // 8 + 1, 8, 32, 128),
    ],
)  # fmt: skip
def test_align_matches_torch_reference(num_tokens, top_k, num_experts, block_m, gen, device):
    ids = torch.randint(-1, num_experts, (num_tokens, top_k), generator=gen, dtype=torch.int32)
    ours = align_pairs_by_expert(ids.to(device), num_experts, block_m)
    ref = align_pairs_by_expert_reference(ids, num_experts, block_m)
    assert torch.equal(ours[0].cpu(), ref[0]) and torch.equal(ours[1].cpu(), ref[1])


def test_chunked_routing_of_many_experts_in_small_chunks(gen, device, monkeypatch):
    # The chunked routing with 65 experts (E_PAD 128) and the last chunk partial, in chunks of 256 pairs from 1024
    # (the same kernels; at the shipped 2048 a chunk the interpreter takes ~25 s, which the case above spends once).
    chunked, calls = routing.route_chunked, []
    monkeypatch.setattr(routing, "route_chunked", lambda *a: calls.append(a) or chunked(*a))
    ids = torch.randint(-1, 65, (1024 // 8 + 3, 8), generator=gen, dtype=torch.int32)
    ours = align_pairs_by_expert(ids.to(device), 65, 64, chunked_from=1024, chunk=256)
    assert len(calls) == 1  # the two launches ran, over 5 chunks
    ref = align_pairs_by_expert_reference(ids, 65, 64)
    assert torch.equal(ours[0].cpu(), ref[0]) and torch.equal(ours[1].cpu(), ref[1])


# A group of experts routed alone (the op's two chains): ids of the group first .. first + E - 1 become 0 .. E - 1,
# every other id is dropped; each pair (a few pairs, one program: against the same routing of the group's ids), the
# sort (many: against the torch reference), past the chunked routing's size (one launch: a group's routing never takes
# the chunked one), int64 ids.
@pytest.mark.parametrize("num_tokens,top_k,experts,first,block_m,each_pair,dtype", [
    (2, 8, 16, 16, 16, True, torch.int32), (2, 8, 16, 0, 16, True, torch.int32),
    (37, 8, 16, 16, 16, False, torch.int32), (41, 4, 5, 3, 32, False, torch.int64),
    (CHUNKED_ROUTE_PAIRS // 8 + 1, 8, 16, 16, 16, False, torch.int32),
])  # fmt: skip
def test_a_group_of_experts_routes_as_its_own_ids(num_tokens, top_k, experts, first, block_m, each_pair, dtype, gen,
                                                  device):  # fmt: skip
    ids = torch.randint(-1, 2 * first + experts, (num_tokens, top_k), generator=gen).to(dtype)
    route = route_pairs(ids.to(device), experts, block_m, each_pair=each_pair, first_expert=first)
    mine = (ids >= first) & (ids < first + experts)
    own = torch.where(mine, ids - first, -1)
    if each_pair:
        want = route_pairs(own.to(device), experts, block_m, each_pair=True)
        want = (want.sorted_ids.cpu(), want.block_expert.cpu())
    else:
        want = align_pairs_by_expert_reference(own, experts, block_m)
    assert torch.equal(route.sorted_ids.cpu(), want[0]) and torch.equal(route.block_expert.cpu(), want[1])
    used = int((want[1] >= 0).sum())
    assert int(route.used_blocks.cpu()) == used


# Chains over every n-th active expert (``route_pairs(chain=(c, n))``): each routing keeps its experts' own ids and
# equals the reference's routing of the ids of those experts alone (active[c::n]: the n routings take each pair once).
# A few tokens (some experts active, where the rank among the active ones matters), many (every expert), n = 3 over 32
# experts (uneven shares), int64 ids, past the chunked routing's size (one launch still).
@pytest.mark.parametrize("num_tokens,top_k,experts,chains,block_m,dtype", [
    (3, 8, 32, 2, 16, torch.int32), (5, 8, 32, 4, 16, torch.int32), (64, 8, 32, 2, 64, torch.int32),
    (7, 4, 32, 3, 16, torch.int64), (CHUNKED_ROUTE_PAIRS // 8 + 1, 8, 16, 2, 16, torch.int32),
])  # fmt: skip
def test_chains_over_every_nth_active_expert(num_tokens, top_k, experts, chains, block_m, dtype, gen, device):
    ids = torch.randint(-1, experts, (num_tokens, top_k), generator=gen).to(dtype)
    active = torch.unique(ids[ids >= 0])
    for c in range(chains):
        mine = torch.isin(ids, active[c::chains])
        route = route_pairs(ids.to(device), experts, block_m, chain=(c, chains))
        want = align_pairs_by_expert_reference(torch.where(mine, ids, -1), experts, block_m)
        blocks = want[1].numel()  # the reference's bound is for every expert; a chain's, for ceil(E / n)
        assert route.block_expert.numel() <= blocks
        used = int((want[1] >= 0).sum())
        assert int(route.used_blocks.cpu()) == used
        assert torch.equal(route.block_expert.cpu()[:used], want[1][:used])
        assert torch.equal(route.sorted_ids.cpu()[: used * block_m], want[0][: used * block_m])
        assert (route.block_expert.cpu()[used:] == -1).all()


def test_a_chain_routing_refuses_bad_chains():
    ids = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="chain"):
        route_pairs(ids, 32, 16, chain=(2, 2))
    with pytest.raises(ValueError, match="each_pair"):
        route_pairs(ids, 32, 16, chain=(0, 2), each_pair=True)


# (20, 8, 8, 16): under 32 tokens, the activation layout in tiles of 16 rows, as at chunked-prefill sizes
@pytest.mark.parametrize("num_tokens,top_k,num_experts,block_m", [
    (50, 8, 8, 16), (37, 4, 40, 32), (64, 8, 3, 64), (20, 8, 8, 16),
])  # fmt: skip
def test_the_chunked_routing_matches_the_one_launch_sort(num_tokens, top_k, num_experts, block_m, gen, device,
                                                         monkeypatch):  # fmt: skip
    # Chunks of 64 pairs (the last partial; chunks with no pair of some experts, experts with none), activations laid
    # out and counters zeroed by the same launches: every output equal to the one-launch sort's, the reference's.
    from sglang_glm5 import routing

    ids = torch.randint(-1, num_experts, (num_tokens, top_k), generator=gen, dtype=torch.int32).to(device)
    x = torch.randn(num_tokens, 128, generator=gen).bfloat16().to(device)
    outs = []
    for chunked in (False, True):
        xp = torch.full_like(x, float("nan"))
        zero = torch.full((300,), 7, dtype=torch.int32, device=device)
        route = routing.route_pairs(ids, num_experts, block_m, zero=zero, permute=(x, xp), layout="kernel_wgmma",
                                    chunked_from=64 if chunked else 1 << 40, chunk=64)  # fmt: skip
        outs.append((*route, xp, zero))
    for one, two in zip(*outs, strict=True):
        assert torch.equal(one, two)
    assert not outs[1][-1].any() and torch.equal(outs[1][-2], routing.prepare_activations(x, "kernel_wgmma"))
    ref = align_pairs_by_expert_reference(ids.cpu(), num_experts, block_m)
    assert torch.equal(outs[1][0].cpu(), ref[0]) and torch.equal(outs[1][1].cpu(), ref[1])


# (tokens, hidden, weight layout): 37 rows, a partial tile; 288 / 320 columns, a masked K tile; 100 rows, busy decode's
# tiles of 64 rows (routing.permute_rows), the second partial; 300 rows, past busy decode: 19 tiles of 16, the last
# partial
@pytest.mark.parametrize("num_tokens,hidden,layout", [
    (1, 256, "kernel"), (37, 288, "checkpoint"), (0, 64, "kernel"), (37, 320, "kernel_wgmma"), (2, 64, "kernel_wgmma"),
    (100, 128, "kernel_wgmma"), (300, 64, "kernel"),
])  # fmt: skip
def test_routing_launch_writes_the_activation_layout(num_tokens, hidden, layout, gen, device):
    # The op has the routing launch also write x in the GEMMs' K order (one launch fewer at decode): the
    # same bits as prepare_activations, every row, and that order is the documented permutation.
    from sglang_glm5 import routing

    x = torch.randn(num_tokens, hidden, generator=gen).bfloat16().to(device)
    ids = torch.randint(-1, 8, (num_tokens, 4), generator=gen, dtype=torch.int32).to(device)
    xp = torch.full_like(x, float("nan"))
    route = routing.route_pairs(ids, 8, 16, permute=(x, xp), layout=layout)
    assert torch.equal(xp, routing.prepare_activations(x, layout))
    alone = routing.route_pairs(ids, 8, 16)
    assert all(torch.equal(a, b) for a, b in zip(route, alone, strict=True))
    n = torch.arange(hidden)
    if layout == "kernel_wgmma":  # column 64g + 16b + 8h + 4i + q at 64g + 16q + 8h + 2b + i
        pos = (n // 64) * 64 + (n % 4) * 16 + ((n // 8) % 2) * 8 + ((n % 64) // 16) * 2 + (n // 4) % 2
    else:  # column 32g + 4c + q at 32g + 8q + c
        pos = (n // 32) * 32 + (n % 4) * 8 + (n % 32) // 4
    assert torch.equal(xp.cpu()[:, pos], x.cpu())


def test_the_wgmma_activation_order_needs_k_in_multiples_of_64(gen, device):
    from sglang_glm5 import routing

    x = torch.randn(2, 96, generator=gen).bfloat16().to(device)
    with pytest.raises(ValueError, match="kernel_wgmma layout: K must be a multiple of 64, got 96"):
        routing.prepare_activations(x, "kernel_wgmma")


def test_align_pairs_by_expert(device):
    ids = torch.tensor([[2, 0], [2, -1], [5, 2], [0, 7]], dtype=torch.int32)  # E = 6: 7 is out of range
    sorted_ids, block_expert = (t.cpu() for t in align_pairs_by_expert(ids.to(device), 6, 4))
    num_pairs = ids.numel()
    assert sorted_ids.numel() == block_expert.numel() * 4
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        block = sorted_ids[b * 4 : (b + 1) * 4].tolist()
        real = [p for p in block if p < num_pairs]
        if e < 0:
            assert real == []
            continue
        assert all(flat[p] == e for p in real) and real == sorted(real)
        seen += real
    assert sorted(seen) == [p for p in range(num_pairs) if 0 <= flat[p] < 6]
    assert block_expert.tolist()[:3] == [0, 2, 5] and set(block_expert.tolist()[3:]) == {-1}


# --- Bad input: each a TypeError or ValueError naming the argument --------------------------------


def _good(gen, device):
    layer = random_layer(4, 64, 32, gen)
    x = torch.randn(3, 64, generator=gen).bfloat16()
    weights, ids = random_routing(3, 4, 2, gen)
    args = dict(
        hidden_states=x, w13=layer.w13, w13_scale=layer.w13_scale, w13_scale_2=layer.w13_scale_2, w2=layer.w2,
        w2_scale=layer.w2_scale, w2_scale_2=layer.w2_scale_2, topk_weights=weights, topk_ids=ids,
    )  # fmt: skip
    return {k: v.to(device) for k, v in args.items()}


BAD = [
    ("hidden_states", lambda a: a["hidden_states"].float(), TypeError, "hidden_states: expected dtype"),
    # H comes from the weights (checked once); hidden states of another width are the call's error
    (
        "hidden_states",
        lambda a: a["hidden_states"][:, :32].contiguous(),
        ValueError,
        r"hidden_states: expected shape \[\*, 64\]",
    ),
    ("hidden_states", lambda a: a["hidden_states"][None], ValueError, "hidden_states: expected shape"),
    ("hidden_states", lambda a: a["hidden_states"].T.contiguous().T, ValueError, "rows must be contiguous"),
    ("w13", lambda a: a["w13"][:, :, :24].contiguous(), ValueError, "H a positive multiple of 32, got 24"),
    ("w13", lambda a: a["w13"].view(torch.int8), TypeError, "w13: expected dtype torch.uint8"),
    ("w13", lambda a: a["w13"][:, :48], ValueError, r"w13: dim 1 must be 2\*I with I a positive multiple of 32"),
    # empty K dimensions: the kernels' K loops assume at least one step
    ("hidden_states", lambda a: a["hidden_states"][:, :0], ValueError, r"expected shape \[\*, 64\], got \[3, 0\]"),
    ("w13", lambda a: a["w13"][:, :, :0], ValueError, "H a positive multiple of 32, got 0"),
    ("w13", lambda a: a["w13"][:, :0], ValueError, r"2\*I with I a positive multiple of 32, got 0"),
    ("w13", lambda a: a["w13"].transpose(1, 2).contiguous().transpose(1, 2), ValueError, "w13: must be contiguous"),
    ("w13_scale", lambda a: a["w13_scale"].view(torch.uint8), TypeError, "w13_scale: expected dtype"),
    ("w13_scale", lambda a: a["w13_scale"][:3], ValueError, "w13_scale: expected shape"),
    ("w13_scale_2", lambda a: a["w13_scale_2"][:, :1], ValueError, "w13_scale_2: expected shape"),
    ("w13_scale_2", lambda a: a["w13_scale_2"].double(), TypeError, "w13_scale_2: expected dtype"),
    ("w2", lambda a: a["w2"][:, :32], ValueError, "w2: expected shape"),
    ("w2_scale", lambda a: a["w2_scale"].float(), TypeError, "w2_scale: expected dtype"),
    ("w2_scale_2", lambda a: a["w2_scale_2"][:1], ValueError, "w2_scale_2: expected shape"),
    ("topk_weights", lambda a: a["topk_weights"].bfloat16(), TypeError, "topk_weights: expected dtype"),
    ("topk_weights", lambda a: a["topk_weights"][:2], ValueError, "topk_weights: expected shape"),
    ("topk_ids", lambda a: a["topk_ids"].float(), TypeError, "topk_ids: expected dtype"),
    ("topk_ids", lambda a: a["topk_ids"][:, :1], ValueError, "topk_ids: expected shape"),
    ("topk_ids", lambda a: torch.full_like(a["topk_ids"], 4), ValueError, r"topk_ids: expected values in \[-1, 3\]"),
    ("topk_ids", lambda a: torch.full_like(a["topk_ids"], -2), ValueError, r"got -2"),
    ("w2", lambda a: "not a tensor", TypeError, "w2: expected a torch.Tensor, got str"),
]


@pytest.mark.parametrize("name,mutate,exc,match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_clear_error(name, mutate, exc, match, gen, device):
    args = _good(gen, device)
    args[name] = mutate(args)
    with pytest.raises(exc, match=match):
        nvfp4_fused_moe(**args)


def test_bad_w13_order_and_config(gen, device):
    with pytest.raises(ValueError, match="w13_order: expected one of"):
        nvfp4_fused_moe(**_good(gen, device), w13_order="gate-up")
    with pytest.raises(TypeError, match="config: expected MoeConfig"):
        nvfp4_fused_moe(**_good(gen, device), config={"block_m": 16})


def test_tensors_on_different_devices_rejected(gen, device):
    args = _good(gen, device)
    args["w2_scale_2"] = args["w2_scale_2"].to("meta")
    with pytest.raises(ValueError, match="w2_scale_2: expected device"):
        nvfp4_fused_moe(**args)


def test_bad_gemm_config():
    with pytest.raises(ValueError, match="block_k must be >= 32"):
        GemmConfig(16, 64, 16)
    with pytest.raises(ValueError, match="power of two"):
        GemmConfig(24, 64, 64)


def test_block_k_below_64_is_refused_by_the_w4a16_kernels(gen, device):
    # Four quarter-width dots of block_k / 4 need block_k >= 64; GemmConfig itself allows 32 (W4A4).
    small = GemmConfig(16, 64, 32)
    with pytest.raises(ValueError, match="block_k must be >= 64"):
        nvfp4_fused_moe(**_good(gen, device), config=MoeConfig(small, small))


def test_check_ids_off_drops_out_of_range_ids_without_a_sync(gen, device):
    # check_ids=False (what the SGLang plugin passes) skips the host check; the kernels still drop
    # ids outside [0, E), so the result equals the reference with those slots marked -1.
    args = _good(gen, device)
    num_experts = args["w13"].shape[0]
    bad = args["topk_ids"].clone()
    bad[0, 0] = num_experts  # out of range
    with pytest.raises(ValueError, match="topk_ids: expected values"):
        nvfp4_fused_moe(**{**args, "topk_ids": bad})
    got = nvfp4_fused_moe(**{**args, "topk_ids": bad}, check_ids=False).cpu().double()
    dropped = bad.clone()
    dropped[0, 0] = -1
    want = nvfp4_fused_moe_reference(*(v.cpu() for v in {**args, "topk_ids": dropped}.values()))
    assert ((got - want).norm() / want.norm()) < 1e-2


def test_num_global_experts_sets_tokens_per_expert(gen, device, monkeypatch):
    # Under expert parallelism (ids of other ranks' experts are -1) the tile choice must use
    # T * k / global experts, not T * k / local experts: 8x too many under EP8.
    from sglang_glm5 import autotune

    seen = []
    real = autotune.pick_config
    monkeypatch.setattr(autotune, "pick_config", lambda path, tpe, *a: seen.append(tpe) or real(path, tpe, *a))
    args = _good(gen, device)  # T = 3, k = 2, E = 4 local experts
    nvfp4_fused_moe(**args)
    nvfp4_fused_moe(**args, num_global_experts=32)
    assert seen == [6 / 4, 6 / 32]
    with pytest.raises(ValueError, match="num_global_experts: expected an int >= the 4 local experts"):
        nvfp4_fused_moe(**args, num_global_experts=2)


@pytest.mark.parametrize("shrink", [1e-2, 1e-4])
def test_small_intermediate_values_keep_their_precision(shrink, gen, device):
    # h = silu(gate) * up far below 1 (small global scales): h must not lose bits on its way to
    # gemm2 (an fp16 h scaled by 2^-8 did: error 8e-2 at rms(h) ~ 5e-5).
    layer = random_layer(8, 256, 128, gen)
    w13, s13, g13, w2, s2, g2 = layer.args()
    g13 = g13 * shrink
    x = torch.randn(9, 256, generator=gen).bfloat16()
    weights, ids = random_routing(9, 8, 4, gen)
    args = (x, w13, s13, g13, w2, s2, g2, weights, ids)
    want = nvfp4_fused_moe_reference(*args)
    got = nvfp4_fused_moe(*(a.to(device) for a in args)).cpu().double()
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-2, f"relative error {err:.2e} with gate/up global scales x {shrink}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_replays_from_a_cuda_graph_with_new_inputs(gen, device):
    # SGLang runs decode from CUDA graphs: the op, called as the plugin calls it (check_ids=False), must
    # capture (no host synchronization, no host-side data) and a replay must follow new data written
    # into the captured input tensors.
    if device.type != "cuda":
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    layer = random_layer(8, 256, 128, gen)
    args = [a.to(device) for a in layer.args()]
    num_tokens, top_k = 6, 4
    x = torch.empty(num_tokens, 256, dtype=torch.bfloat16, device=device)
    weights = torch.empty(num_tokens, top_k, device=device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=device)

    def fill():
        w, i = random_routing(num_tokens, 8, top_k, gen, remote_fraction=0.25)
        x.copy_(torch.randn(num_tokens, 256, generator=gen).bfloat16())
        weights.copy_(w)
        ids.copy_(i)

    fill()
    nvfp4_fused_moe(x, *args, weights, ids, check_ids=False)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = nvfp4_fused_moe(x, *args, weights, ids, check_ids=False)
    for _ in range(2):
        fill()
        graph.replay()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), weights.cpu(), ids.cpu())
        got = out.cpu().double()
        assert ((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.parametrize("per_program,inter", [(2, 128), (3, 128), (8, 128), (3, 64)])
def test_gemm2_tiles_per_program_leave_the_result_unchanged(per_program, inter, gen, device):
    # gemm2's multi-tile loop (several N tiles per program, in strides of the program count) does the
    # same arithmetic in the same K order as one tile per program: bit-identical output, every tile
    # written once (7 tiles of 32: uneven splits). I = 64 is one K step: the activations are loaded once.
    from sglang_glm5 import routing

    num_experts, hidden, top_k = 4, 224, 2
    layer = random_layer(num_experts, hidden, inter, gen)
    weights, ids = random_routing(10, num_experts, top_k, gen)
    h = torch.randn(ids.numel(), inter, generator=gen).bfloat16().to(device)
    cfg = GemmConfig(16, 32, 64)
    route = routing.route_pairs(ids.to(device), num_experts, cfg.block_m)
    args = (h, *(t.to(device) for t in layer.args()[3:]), weights.reshape(-1).to(device), route)
    outs = []
    for p in (1, per_program):
        y = torch.full((ids.numel(), hidden), float("nan"), dtype=torch.bfloat16, device=device)
        w4a16.launch_gemm2(*args, y, cfg, routing.interpreting(), per_program=p)
        outs.append(y.cpu())
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="per_program: expected N tiles per program >= 1, got 0"):
        w4a16.launch_gemm2(*args, y, cfg, routing.interpreting(), per_program=0)


def test_a_one_k_step_gemm2_tile_gives_the_same_bits_and_runs_only_so(gen, device):
    # GemmConfig.one_k_step runs gemm2 in its one-step form (I <= block_k, several N tiles a program, activations
    # loaded once): the same bits as the tile unmarked one N tile a program (the form that loops over K); a launch
    # that cannot run it so (one tile a program, or I deeper than block_k) is refused, not run in a form its shared
    # memory was not checked for.
    from sglang_glm5 import routing

    num_experts, hidden, inter, top_k = 4, 224, 64, 2
    layer = random_layer(num_experts, hidden, inter, gen)
    weights, ids = random_routing(9, num_experts, top_k, gen)
    h = torch.randn(ids.numel(), inter, generator=gen).bfloat16().to(device)
    plain, one = GemmConfig(16, 32, 64), GemmConfig(16, 32, 64, one_k_step=True)
    route = routing.route_pairs(ids.to(device), num_experts, plain.block_m)
    args = (h, *(t.to(device) for t in layer.args()[3:]), weights.reshape(-1).to(device), route)
    outs = []
    for cfg, per_program in ((plain, 1), (one, 3)):
        y = torch.full((ids.numel(), hidden), float("nan"), dtype=torch.bfloat16, device=device)
        w4a16.launch_gemm2(*args, y, cfg, routing.interpreting(), per_program=per_program)
        outs.append(y.cpu())
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="K in one step and several N tiles a program, got 1 of 7"):
        w4a16.launch_gemm2(*args, y, one, routing.interpreting(), per_program=1)
    deep = torch.randn(ids.numel(), 2 * inter, generator=gen).bfloat16().to(device)
    with pytest.raises(ValueError, match="is a gemm2 tile for K <= 64 and N > 32, got N = 224, K = 128"):
        w4a16.launch_gemm2(deep, *args[1:], y, one, routing.interpreting(), per_program=3)


@pytest.mark.parametrize("text", ["8,0,128", "8,256,0", "0,256,128", "8,48,128"])
def test_shapes_without_a_k_step_are_refused(text):
    # The kernels assume every K loop runs at least once: a layer shape with H or I = 0 is an error.
    from sglang_glm5.shapes import parse_shape

    with pytest.raises(ValueError, match="positive multiples of 32"):
        parse_shape(text)


@pytest.mark.parametrize(("text", "top_k"), [("4,64,32", 4), ("1,64,32", 1), ("8,64,32", 8), ("300,64,32", 8)])
def test_a_shape_of_few_experts_routes_each_token_to_all(text, top_k):
    # 'E,H,I' is top-8 as GLM-5 is; with fewer than 8 experts a token can only take E distinct ones.
    from sglang_glm5.shapes import parse_shape

    assert parse_shape(text).top_k == top_k
