"""The W4A16 op's call plan (``w4a16_plan.call_plan``): a pure function of the call's sizes, tiles, device and
settings (``w4a16_plan.PlanSettings``), worked out once per distinct call and remembered on exactly that key: other
settings passed between two calls of one shape give the plan they imply, never the one remembered from before.
Host-side: runs on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_glm5.moe import fused_moe
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.variants import w4a16_plan
from sglang_glm5.variants.w4a16_plan import PlanSettings
from sglang_glm5.variants.w4a16_tiles import heuristic_config
from sglang_glm5.weights import Nvfp4MoeWeights

CPU = torch.device("cpu")
EP8 = {"num_experts": 32, "num_global_experts": 256, "hidden": 6144, "inter": 2048}  # GLM-5 under 8-way EP
SHIPPED = PlanSettings()  # the defaults, whatever the caller's environment holds


def plan(batch: int, cfg: MoeConfig | None = None, settings: PlanSettings = SHIPPED) -> w4a16_plan.CallPlan:
    """The call plan of GLM-5 EP8 at B = ``batch`` tokens (top-8), on the CPU (the interpreter's 8 SMs)."""
    cfg = cfg or heuristic_config(batch * 8 / EP8["num_global_experts"])
    return w4a16_plan.call_plan(cfg, batch * 8, EP8["num_experts"], EP8["num_global_experts"], EP8["hidden"],
                                EP8["inter"], CPU, torch.bfloat16, "checkpoint", settings)  # fmt: skip


def fresh(batch: int, cfg: MoeConfig | None = None, settings: PlanSettings = SHIPPED) -> w4a16_plan.CallPlan:
    """The same plan worked out anew (no memo)."""
    cfg = cfg or heuristic_config(batch * 8 / 256)
    return w4a16_plan.plan_call(cfg, batch * 8, 32, 256, 6144, 2048, CPU, torch.bfloat16, "checkpoint",
                                w4a16_plan.sm_count(None), settings)  # fmt: skip


@pytest.mark.parametrize("batch", [1, 2, 8, 64, 2048])  # each pair a block; two chains; one; busy; chunked routing
def test_a_call_plan_is_remembered_and_equals_a_fresh_one(batch):
    first = plan(batch)
    assert plan(batch) is first, "the second call of one shape reads the memo"
    assert first == fresh(batch)


def test_other_settings_give_their_own_plan():
    # GLM-5 EP8 B = 8 runs as two chains (1/4 token per expert, in the chains' span)
    assert plan(8).chains == 2
    assert plan(8, settings=dataclasses.replace(SHIPPED, two_chains=False)).chains == 1, "not the remembered two"
    assert plan(8).chains == 2
    assert plan(8).interleaved
    assert not plan(8, settings=dataclasses.replace(SHIPPED, interleaved_tokens_per_expert=0)).interleaved, "halves"
    assert plan(8, settings=dataclasses.replace(SHIPPED, chunked_route_pairs=8)).chains == 1, "a two-launch routing"
    # B = 1 splits K to fill the SMs: a higher aim, more splits
    more = dataclasses.replace(SHIPPED, programs_per_sm=8)
    assert plan(1, settings=more).gemms.gemm1.splits > plan(1).gemms.gemm1.splits
    assert plan(1, settings=more) == fresh(1, settings=more)


def test_the_settings_read_the_switches_once():
    on = PlanSettings.from_env({})
    assert on == SHIPPED
    off = PlanSettings.from_env(
        {"SGLANG_GLM5_TWO_CHAINS": "0", "SGLANG_GLM5_PDL": "off", "SGLANG_GLM5_GLUON_GEMM1": "0"}
    )
    assert (off.two_chains, off.pdl, off.gluon) == (False, False, False)
    with pytest.raises(ValueError, match="SGLANG_GLM5_TWO_CHAINS"):
        PlanSettings.from_env({"SGLANG_GLM5_TWO_CHAINS": "maybe"})
    assert w4a16_plan.default_settings() is w4a16_plan.default_settings(), "read once per process"


@pytest.mark.parametrize("changes,match", [
    ({"chains_tokens_per_expert": (0.5, 0.25)}, "chains_tokens_per_expert"),  # an empty span
    ({"chains": 0}, "chains"),
    ({"programs_per_sm": 0}, "programs_per_sm"),
])  # fmt: skip
def test_settings_refuse_what_no_plan_can_take(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(SHIPPED, **changes)


def test_the_op_refuses_settings_of_another_type(gen):
    layer = random_layer(2, 64, 32, gen)
    w, ids = random_routing(1, 2, 1, gen)
    weights = Nvfp4MoeWeights.build(*layer.args())
    with pytest.raises(TypeError, match="settings: expected w4a16_plan.PlanSettings or None, got dict"):
        fused_moe(torch.randn(1, 64, generator=gen).bfloat16(), weights, w, ids, settings={"chains": 2})


def test_the_sm_count_is_part_of_the_key(monkeypatch):
    # B = 1 splits K to fill the SMs: an H200's 132 ask for more splits than the interpreter's eight
    eight = plan(1)
    monkeypatch.setattr(w4a16_plan, "sm_count", lambda index: 132)
    assert plan(1).gemms.gemm1.splits > eight.gemms.gemm1.splits


def test_pdl_takes_every_launch_where_it_runs(monkeypatch):
    # the launches that use PDL: all of PDL_LAUNCHES where PDL applies (here: told it runs, below a token per expert),
    # none with the switch off
    monkeypatch.setattr(w4a16_plan, "pdl_runs_on", lambda device: True)
    assert fresh(1).pdl == frozenset(w4a16_plan.PDL_LAUNCHES)
    assert fresh(1, settings=dataclasses.replace(SHIPPED, pdl=False)).pdl == frozenset()


def test_every_mode_names_real_settings_and_every_setting_a_mode():
    fields = {f.name for f in dataclasses.fields(PlanSettings)}
    named = {name for mode in w4a16_plan.MODES for name in mode.settings}
    assert named <= fields, f"modes name settings that do not exist: {sorted(named - fields)}"
    general = {"programs_per_sm"}  # every split launch
    assert fields - named <= general, f"settings no mode names: {sorted(fields - named - general)}"
    plan_fields = {f.name for f in dataclasses.fields(w4a16_plan.CallPlan)}
    for mode in w4a16_plan.MODES:
        if not mode.field.startswith("("):
            assert {f.strip().split(".")[0] for f in mode.field.split(",")} <= plan_fields, mode


def test_the_op_plans_a_shape_once(gen, device):
    # through the op (the interpreter, or a GPU): three calls of one shape, one plan worked out; a new T, a new plan
    layer = random_layer(8, 256, 128, gen)
    weights = Nvfp4MoeWeights.build(*(a.to(device) for a in layer.args())).for_device()
    settings = dataclasses.replace(SHIPPED, each_pair_max_pairs=15)  # settings no other test plans with
    missed = []
    for tokens in (3, 3, 3, 5):
        w, ids = random_routing(tokens, 8, 2, gen)
        x = torch.randn(tokens, 256, generator=gen).bfloat16()
        before = w4a16_plan.planned.cache_info().misses
        fused_moe(x.to(device), weights, w.to(device), ids.to(device), check_ids=False, settings=settings)
        missed.append(w4a16_plan.planned.cache_info().misses - before)
    assert missed == [1, 0, 0, 1], "one plan per distinct pair count"
