"""The W4A16 op's call plan (``w4a16_plan.call_plan``): worked out once per distinct call and remembered, so the memo
key must hold every input the rules read. A switch, a setting, a rule function or the device's SM count changed
between two calls of one shape must give the plan it implies, never the one remembered from before. Host-side: runs
on the CPU."""

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
from sglang_glm5.weights import Nvfp4MoeWeights

CPU = torch.device("cpu")
EP8 = {"num_experts": 32, "num_global_experts": 256, "hidden": 6144, "inter": 2048}  # GLM-5 under 8-way EP


@pytest.fixture(autouse=True)
def _switches_unset(monkeypatch):
    """The plan's switches at their defaults, whatever the caller's environment holds."""
    for name in w4a16_plan.PLAN_SWITCHES:
        monkeypatch.delenv(name, raising=False)


def plan(batch: int, cfg: MoeConfig | None = None) -> w4a16_plan.CallPlan:
    """The call plan of GLM-5 EP8 at B = ``batch`` tokens (top-8), on the CPU (the interpreter's 8 SMs)."""
    cfg = cfg or heuristic_config(batch * 8 / EP8["num_global_experts"])
    return w4a16_plan.call_plan(cfg, batch * 8, EP8["num_experts"], EP8["num_global_experts"], EP8["hidden"],
                                EP8["inter"], CPU, torch.bfloat16, "checkpoint")  # fmt: skip


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
    for _ in range(2):  # a bad value is refused on every call, never remembered
        with pytest.raises(ValueError, match="SGLANG_GLM5_TWO_CHAINS"):
            plan(8)


def test_the_sm_count_is_part_of_the_key(monkeypatch):
    # B = 1 splits K to fill the SMs: an H200's 132 ask for more splits than the interpreter's eight
    eight = plan(1)
    monkeypatch.setattr(w4a16_plan, "sm_count", lambda index: 132)
    assert plan(1).gemms.gemm1.splits > eight.gemms.gemm1.splits


def test_a_rule_replaced_between_calls_gives_its_own_plan(monkeypatch):
    # experiments replace a rule function (gemm2's N tiles a program, the grids) rather than a setting
    assert plan(64).gemms.per_program == 1
    monkeypatch.setattr(w4a16_plan, "gemm2_tiles_per_program", lambda inter, cfg: 2)
    assert plan(64).gemms.per_program == 2
    # the launches that use PDL follow PDL_LAUNCHES where PDL applies (here: told it does, below a token per expert)
    monkeypatch.setattr(w4a16_plan, "uses_pdl", lambda device: True)
    assert plan(1).pdl == frozenset(w4a16_plan.PDL_LAUNCHES)
    monkeypatch.setattr(w4a16_plan, "PDL_LAUNCHES", ("route", "gemm2"))
    assert plan(1).pdl == {"route", "gemm2"}


def test_a_setting_that_keys_nothing_is_planned_not_remembered(monkeypatch):
    monkeypatch.setattr(w4a16_plan, "_PLANS", {})
    monkeypatch.setattr(w4a16_plan, "PDL_LAUNCHES", ["route", "sum"])  # a list: no dict key
    assert plan(8) == fresh(8)
    assert not w4a16_plan._PLANS


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


def test_the_key_holds_every_setting_and_rule_the_rules_read():
    # independently of the module's own walk: each function of RULES, each UPPER_CASE name or function it reads as a
    # global of its own module or an attribute of another of the three
    keyed = {(space["__name__"], name) for space, name in w4a16_plan._KEY_NAMES}
    modules = (w4a16_plan, routing, w4a16_gluon)
    for rule in RULES:
        for name in _globals_read(rule):
            for module in modules:
                value = vars(module).get(name)
                if (name.isupper() and value is not None) or callable(value) and not isinstance(value, type):
                    if isinstance(value, dict) or name in ("NamedTuple",):
                        continue
                    assert (module.__name__, name) in keyed, f"{module.__name__}.{name}, read by {rule.__name__}"
    for space, name in w4a16_plan._KEY_NAMES:
        hash(space[name])  # each keys a dict
    assert ("sglang_glm5.variants.w4a16_gluon", "TILES") not in keyed, "the tuner's tiles: no plan reads them"


def test_the_op_plans_a_shape_once(gen, device, monkeypatch):
    # through the op (the interpreter, or a GPU): three calls of one shape, one plan worked out; a new T, a new plan
    layer = random_layer(8, 256, 128, gen)
    weights = Nvfp4MoeWeights.build(*(a.to(device) for a in layer.args())).for_device()
    planned = []
    real = w4a16_plan.plan_call
    monkeypatch.setattr(w4a16_plan, "_PLANS", {})
    monkeypatch.setattr(w4a16_plan, "plan_call", lambda *a, **k: planned.append(a[1]) or real(*a, **k))
    for tokens in (3, 3, 3, 5):
        w, ids = random_routing(tokens, 8, 2, gen)
        x = torch.randn(tokens, 256, generator=gen).bfloat16()
        fused_moe(x.to(device), weights, w.to(device), ids.to(device), check_ids=False)
    assert planned == [6, 10], "one plan per distinct pair count"
