"""gemm1 as a stream-K schedule (``GemmConfig.stream``, ``Launch.stream``).

A fixed number of persistent programs shares the K steps of every used (block, N tile) equally; a tile cut between
programs is finished by the last of them to arrive, adding the fp32 partials in program order. These tests pin the
op's result against the float64 reference for one, two and many active experts with remote (-1) slots, at program
counts that cut tiles in different places (fewer programs than tiles, more programs than K steps, some with no
work at all), bit-identity across calls, and a CUDA graph replayed with very different routings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from sglang_glm5 import moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.variants import w4a16


@dataclass(frozen=True)
class Case:
    num_tokens: int
    active: int  # distinct local experts that receive pairs; every other slot is -1 (another rank)
    num_experts: int = 8
    hidden: int = 512
    inter: int = 256
    top_k: int = 4
    idle: int = 0  # tokens with no local slot


CASES = [
    Case(1, active=1),  # one local expert: a few tiles shared by every program
    Case(2, active=2),  # two experts, two blocks
    Case(7, active=8),  # every local expert active, some slots remote
    Case(3, active=2, hidden=544, inter=160),  # masked K tail (544 = 4.25 steps of 128) and N tail
    Case(6, active=3, idle=3),  # half the tokens have no local slot: their rows are 0
]
# Stream programs per SM; the interpreter's GPU has 8 SMs (w4a16.sm_count), so 8, 16 and 40 programs.
PROGRAMS_PER_SM = [1, 2, 5]


def _routing(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    weights, _ = random_routing(case.num_tokens, case.num_experts, case.top_k, gen)
    experts = torch.randperm(case.num_experts, generator=gen)[: case.active]
    ids = torch.full((case.num_tokens, case.top_k), -1, dtype=torch.int32)
    for t in range(case.idle, case.num_tokens):  # each token: one to top_k of the active experts, distinct
        n = int(torch.randint(1, min(case.top_k, case.active) + 1, (1,), generator=gen))
        pick = experts[torch.randperm(case.active, generator=gen)[:n]]
        ids[t, torch.randperm(case.top_k, generator=gen)[:n]] = pick.to(torch.int32)
    return weights, ids


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).norm() / want.norm()).item()


def _stream_config(per_sm: int) -> MoeConfig:
    """The heuristic's decode tiles with gemm1 as a stream-K schedule of ``per_sm`` programs per SM."""
    cfg = w4a16.heuristic_config(1)
    return MoeConfig(dataclasses.replace(cfg.gemm1, stream=per_sm), cfg.gemm2)


@pytest.mark.parametrize("per_sm", PROGRAMS_PER_SM)
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"T{c.num_tokens}-active{c.active}-idle{c.idle}-H{c.hidden}-I{c.inter}"
)
def test_stream_gemm1_matches_float64_reference_and_repeats(case, per_sm, gen, device):
    config = _stream_config(per_sm)
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16()
    weights, ids = _routing(case, gen)
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    args = [a.to(device) for a in (x, *layer.args(), weights, ids)]
    sms = w4a16.sm_count(None if device.type == "cpu" else 0)
    plan = w4a16.plan_gemms(config, ids.numel(), case.num_experts, 8 * case.num_experts, case.hidden, case.inter, sms)
    assert plan.gemm1.stream == per_sm * sms and plan.counters > 0, "the plan must take the stream-K schedule"
    out = moe.nvfp4_fused_moe(*args, config=config, num_global_experts=8 * case.num_experts)
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-2
    if case.idle:
        assert not out[: case.idle].any(), "tokens with no local slot get zeros"
    again = moe.nvfp4_fused_moe(*args, config=config, num_global_experts=8 * case.num_experts)
    assert torch.equal(out, again), "the same call twice must give the same bits"


def test_stream_only_where_a_config_asks_and_up_to_its_pair_limit():
    # GLM-5 EP8 shapes: 32 local experts of 256, H = 6144, I = 2048, on 132 SMs.
    assert w4a16.plan_gemms(w4a16.heuristic_config(1), 8, 32, 256, 6144, 2048, 132).gemm1.stream == 0
    plan = w4a16.plan_gemms(_stream_config(2), 8, 32, 256, 6144, 2048, 132)
    assert plan.gemm1 == w4a16.Launch(plan.gemm1.block_programs, 1, 6144, stream=264)
    assert plan.counters == plan.gemm1.block_programs * 2048 // _stream_config(2).gemm1.block_n
    assert plan.gemm2 == w4a16.plan_gemms(w4a16.heuristic_config(1), 8, 32, 256, 6144, 2048, 132).gemm2
    many = w4a16.STREAM_PAIRS_PER_EXPERT * 256 + 8  # past the sizes where it was measured: the planned grid
    assert w4a16.plan_gemms(_stream_config(2), many, 32, 256, 6144, 2048, 132).gemm1.stream == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_stream_graph_replays_with_one_expert_then_all(gen, device):
    # The stream programs read the blocks in use from the device: a graph captured with one routing stays right
    # when the next step's routing touches every expert, and back.
    if device.type != "cuda":
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    config = _stream_config(2)
    case = Case(4, active=1, num_experts=16, hidden=1024, inter=512)
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
    for active in (1, 16, 1):
        fill(active)
        graph.replay()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), weights.cpu(), ids.cpu())
        assert _rel(out, want) < 1e-2, f"{active} active experts"
