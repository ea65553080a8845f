"""The W4A16 op's call plan (``w4a16_plan.call_plan``): worked out once per distinct call and remembered, so the memo
key must hold every input the rules read. A switch, a setting or the device's SM count changed between two calls of
one shape must give the plan it implies, never the one remembered from before. Host-side: runs on the CPU."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_glm5 import routing
from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.variants import w4a16_gluon, w4a16_plan
from sglang_glm5.variants.w4a16_tiles import heuristic_config

CPU = torch.device("cpu")
EP8 = {"num_experts": 32, "num_global_experts": 256, "hidden": 6144, "inter": 2048}  # GLM-5 under 8-way EP


def plan(batch: int, cfg: MoeConfig | None = None, **changes) -> w4a16_plan.CallPlan:
    """The call plan of GLM-5 EP8 at B = ``batch`` tokens (top-8), on the CPU (the interpreter's 8 SMs)."""
    shape = {**EP8, **changes}
    cfg = cfg or heuristic_config(batch * 8 / shape["num_global_experts"])
    return w4a16_plan.call_plan(cfg, batch * 8, shape["num_experts"], shape["num_global_experts"], shape["hidden"],
                                shape["inter"], CPU, torch.bfloat16, "checkpoint")  # fmt: skip


def fresh(batch: int, cfg: MoeConfig | None = None) -> w4a16_plan.CallPlan:
    """The same plan worked out anew (no memo)."""
    cfg = cfg or heuristic_config(batch * 8 / 256)
    return w4a16_plan.plan_call(cfg, batch * 8, 32, 256, 6144, 2048, CPU, torch.bfloat16, "checkpoint",
                                w4a16_plan.sm_count(None))  # fmt: skip


@pytest.mark.parametrize("batch", [1, 2, 8, 64, 2048])  # each pair a block; two chains; one; busy; chunked routing
def test_a_call_plan_is_remembered_and_equals_a_fresh_one(batch):
    first = plan(batch)
    assert plan(batch) is first, "the second call of one shape reads the memo"
    assert first == fresh(batch)


def test_a_setting_changed_between_calls_gives_its_own_plan(monkeypatch):
    # GLM-5 EP8 B = 8 runs as two chains (1/4 token per expert, in TWO_CHAINS_TOKENS_PER_EXPERT)
    assert plan(8).chains == 2
    monkeypatch.setattr(w4a16_plan, "TWO_CHAINS_TOKENS_PER_EXPERT", None)
    assert plan(8).chains == 1, "the span taken away: one chain, not the remembered two"
    monkeypatch.undo()
    assert plan(8).chains == 2
    monkeypatch.setattr(w4a16_plan, "INTERLEAVED_TOKENS_PER_EXPERT", 0.0)
    assert not plan(8).interleaved, "the halves"
    monkeypatch.setattr(routing, "CHUNKED_ROUTE_PAIRS", 8)
    assert plan(8).chains == 1, "a two-launch routing takes one chain"


def test_a_switch_changed_between_calls_gives_its_own_plan(monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_TWO_CHAINS", "1")
    assert plan(8).chains == 2
    monkeypatch.setenv("SGLANG_GLM5_TWO_CHAINS", "0")
    assert plan(8).chains == 1
    monkeypatch.setenv("SGLANG_GLM5_TWO_CHAINS", "maybe")
    with pytest.raises(ValueError, match="SGLANG_GLM5_TWO_CHAINS"):
        plan(8)  # a bad value is refused on every call, never remembered


def test_the_sm_count_is_part_of_the_key(monkeypatch):
    # B = 1 splits K to fill the SMs: an H200's 132 ask for more splits than the interpreter's eight
    eight = plan(1)
    monkeypatch.setattr(w4a16_plan, "sm_count", lambda index: 132)
    assert plan(1).gemms.gemm1.splits > eight.gemms.gemm1.splits


def test_a_full_memo_still_plans_each_call(monkeypatch):
    monkeypatch.setattr(w4a16_plan, "_PLANS", {})
    monkeypatch.setattr(w4a16_plan, "MEMO_PLANS", 0)
    first = plan(4)
    assert plan(4) is not first and plan(4) == first
    assert not w4a16_plan._PLANS


def _globals_read(fn) -> set[str]:
    """The global names a function (and the functions nested in it) reads."""
    names, codes = set(), [fn.__code__]
    while codes:
        code = codes.pop()
        names |= set(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


# Every function plan_call reaches, with the module it reads its globals from.
RULES = [
    w4a16_plan.plan_call, w4a16_plan.expert_groups, w4a16_plan.interleaves, w4a16_plan.plan_gemms,
    w4a16_plan.plan_launch, w4a16_plan.chain_sms, w4a16_plan.overlaps_tail, w4a16_plan.awaits_blocks,
    w4a16_plan.in_tail_order, w4a16_plan.gemm2_tiles_per_program, w4a16_plan.k_splits, w4a16_plan.stream_fits,
    w4a16_plan.expected_blocks, routing.uses_pdl, routing.num_blocks_bound, w4a16_gluon.applies,
]  # fmt: skip


def test_the_key_holds_every_setting_the_rules_read():
    # an UPPER_CASE name a rule reads, as a global of its own module or an attribute of another module the rules read
    keyed = {(space["__name__"], name) for space, name in w4a16_plan._setting_names()}
    modules = (w4a16_plan, routing, w4a16_gluon)
    for rule in RULES:
        for name in _globals_read(rule):
            for module in modules:
                if name.isupper() and name in vars(module):
                    assert (module.__name__, name) in keyed, f"{module.__name__}.{name}, read by {rule.__name__}"
    for space, name in w4a16_plan._setting_names():
        hash(space[name])  # a setting keys a dict


def test_the_op_plans_a_shape_once(gen, monkeypatch):
    # through the op (the interpreter): three calls of one shape, one plan worked out; a new T, a new plan
    layer = random_layer(8, 256, 128, gen)
    weights = layer.served()
    planned = []
    real = w4a16_plan.plan_call
    monkeypatch.setattr(w4a16_plan, "_PLANS", {})
    monkeypatch.setattr(w4a16_plan, "plan_call", lambda *a, **k: planned.append(a[1]) or real(*a, **k))
    for tokens in (3, 3, 3, 5):
        w, ids = random_routing(tokens, 8, 2, gen)
        x = torch.randn(tokens, 256, generator=gen).bfloat16()
        fused_moe(x, weights, w, ids, check_ids=False)
    assert planned == [6, 10], "one plan per distinct pair count"
