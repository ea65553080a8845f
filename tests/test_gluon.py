"""The Gluon forms of the W4A16 GEMMs on sm_90 (``variants/w4a16_gluon.py``, ``kernels/nvfp4_moe_gluon.py``): where a
config marked Gluon runs them, what the tuner offers, that they compile for sm_90 ahead of time (CI, no GPU), that
elsewhere the Triton kernels run the same config, and on a GPU that the op with them matches the float64 reference,
gives the Triton kernels' bits, repeats bit for bit, and stays right when a CUDA graph replays other routings."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest
import torch

from sglang_glm5 import aot, autotune, moe, routing
from sglang_glm5.hardware import TARGETS
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.shapes import MoeShape
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16, w4a16_gluon, w4a16_plan
from sglang_glm5.weights import Nvfp4MoeWeights

needs_gluon = pytest.mark.skipif(not w4a16_gluon.available(), reason="this Triton has no Gluon")


@needs_gluon
def test_compiles_for_sm90_with_async_wgmma():
    # In worker processes (sglang_glm5.aot): kernels imported under the interpreter do not compile reliably.
    two = w4a16_gluon.TWO_STAGE_TILE.label
    forms = [("gemm1", 1, False, w4a16_gluon.TILE.label), ("gemm1", 4, True, w4a16_gluon.TILE.label),
             ("gemm1", 3, True, two), ("gemm1", 3, True, w4a16_gluon.GATE_THEN_UP_TILE.label),
             ("gemm2", 1, True, w4a16_gluon.GEMM2_TILE.label),
             ("gemm2", 3, False, w4a16_gluon.GEMM2_TILE.label),
             *[("gemm1", s, True, t.label) for t in w4a16_gluon.PRODUCER_TILES for s in (1, 3)]]  # fmt: skip
    jobs = [[90, s, p, tile, k] for k, s, p, tile in forms]
    results = aot.run_jobs("sglang_glm5.variants.w4a16_gluon:aot_job", jobs)
    limit = min(t.shared_per_block for t in TARGETS.values() if t.arch == 90)
    for (kernel, splits, pdl, tile), got in zip(forms, results, strict=True):
        assert isinstance(got, dict), got
        assert 0 < got["shared"] <= limit
        assert got["wgmma"] and got["cp_async"]
        assert got["gdc_wait"] is pdl and got["gdc_launch"] is pdl
        assert got["atomic"] is (kernel == "gemm1" and splits > 1), "gemm1's split counter, and only there"
        cfg = GemmConfig.from_label(tile)
        assert got["setmaxnreg"] is got["mbarrier_arrive"] is cfg.producer, "the producer form's partitions"
        if cfg.producer:  # the CTA's register budget, split between the partitions (PRODUCER_FORMS)
            assert got["maxnreg"] == w4a16_gluon.PRODUCER_FORMS[cfg.gate_then_up][0]
        else:
            gate_then_up = tile == w4a16_gluon.GATE_THEN_UP_TILE.label
            assert got["maxnreg"] == (w4a16_gluon.REGISTER_CAP if gate_then_up else None), "four 2-stage programs"
        if kernel == "gemm1" and cfg.num_stages == 2:
            # the 2-stage tile's shared memory, four programs an H200 SM; the producer form's mbarriers beside it
            assert got["shared"] == 53248 + (324 if cfg.producer else 0)


@needs_gluon
@pytest.mark.parametrize("splits", [1, 3])
def test_gemm1_with_ready_counters_compiles_one_more_atomic_and_no_more_shared_memory(splits):
    # w4a16_plan.awaits_blocks: each block's stored N tiles counted (one release atomic), with the split counter.
    tile = w4a16_gluon.TWO_STAGE_TILE.label
    jobs = [[90, splits, True, tile, "gemm1", ready] for ready in (False, True)]
    plain, ready = aot.run_jobs("sglang_glm5.variants.w4a16_gluon:aot_job", jobs)
    assert ready["atomics"] == plain["atomics"] + 1 == (2 if splits > 1 else 1)
    assert ready["shared"] == plain["shared"] and ready["gdc_launch"] and ready["gdc_wait"]


@needs_gluon
def test_every_gluon_tile_of_the_shipped_h200_cache_compiles_for_sm90():
    # The cache's Gluon entries (decode and chunked-prefill tiles) were measured under Triton 3.6; this Triton must
    # compile each of them for sm_90 within an H200's shared memory too, unsplit.
    entries = json.loads((autotune.shipped_dir() / "h200.json").read_text())["entries"]
    tiles = sorted({(key.split("|")[2].split(".")[0], GemmConfig(**e["config"]).without_plan().label)
                    for key, e in entries.items() if e["config"].get("gluon")})  # fmt: skip
    assert any(GemmConfig.from_label(t).block_m > 16 for _, t in tiles), "prefill tiles among them"
    results = aot.run_jobs("sglang_glm5.variants.w4a16_gluon:aot_job", [[90, 1, False, t, k] for k, t in tiles])
    limit = TARGETS["h200"].shared_per_block
    for (kernel, tile), got in zip(tiles, results, strict=True):
        assert isinstance(got, dict), (kernel, tile, got)
        assert 0 < got["shared"] <= limit and got["wgmma"] and got["cp_async"], (kernel, tile, got)


def test_label_says_gluon_and_round_trips():
    cfg = dataclasses.replace(w4a16_gluon.TILE, programs_per_sm=1)
    assert cfg.label == "16x64x256-w4-s3-p1-gl"
    assert GemmConfig.from_label(cfg.label) == cfg and GemmConfig(**cfg.as_dict()) == cfg
    assert cfg.without_plan() == w4a16_gluon.TILE, "the kernel is the config's form, not its plan"
    # what the kernels cannot run: over 128 rows, under 64 weight rows a warp group (16 a warp), a short K step, a
    # ring of one stage, warps other than one or two warp groups
    for bad in ((256, 128, 128, 8, 3), (16, 32, 256, 4, 3), (16, 64, 64, 4, 3), (16, 64, 256, 4, 1),
                (16, 64, 256, 8, 3), (16, 64, 256, 2, 3)):  # fmt: skip
        with pytest.raises(ValueError, match="16-128 rows, 4 or 8 warps"):
            GemmConfig(*bad, gluon=True)
    for good in ((128, 128, 128, 8, 3), (64, 64, 128, 4, 4), (32, 128, 256, 4, 3)):  # prefill and in-between tiles
        assert GemmConfig(*good, gluon=True).gluon
    with pytest.raises(ValueError, match="stream-K"):
        dataclasses.replace(w4a16_gluon.TILE, stream=2)
    order = dataclasses.replace(w4a16_gluon.GATE_THEN_UP_TILE, programs_per_sm=3)
    assert order.label == "16x64x256-w4-s2-p3-gl-gu"
    assert GemmConfig.from_label(order.label) == order and GemmConfig(**order.as_dict()) == order
    assert order.without_plan() == w4a16_gluon.GATE_THEN_UP_TILE, "the order is the kernel's form, kept"
    with pytest.raises(ValueError, match="gate_then_up"):
        GemmConfig.from_label("16x64x256-w4-s2-gu")  # an order of the Gluon kernel's wgmmas only
    with pytest.raises(ValueError, match="config label"):
        GemmConfig.from_label("16x64x256-w4-s2-gu-gl")
    producer = dataclasses.replace(w4a16_gluon.GATE_THEN_UP_TILE, programs_per_sm=1, producer=True)
    assert producer.label == "16x64x256-w4-s2-p1-gl-gu-ws"
    assert GemmConfig.from_label(producer.label) == producer and GemmConfig(**producer.as_dict()) == producer
    assert GemmConfig.from_label("16x64x256-w4-s3-gl-ws") == w4a16_gluon.PRODUCER_TILES[0]
    for bad in ("16x64x256-w4-s3-ws", "128x128x256-w8-s2-gl-ws"):  # the Gluon gemm1 of one warp group only
        with pytest.raises(ValueError, match="producer"):
            GemmConfig.from_label(bad)
    with pytest.raises(ValueError, match="config label"):
        GemmConfig.from_label("16x64x256-w4-s2-gl-ws-gu")


def test_gemm2_refuses_the_gate_then_up_order():
    # gemm2 has one weight matrix: a config asking for gemm1's order there is a mistake, not a no-op
    with pytest.raises(ValueError, match="gate_then_up orders gemm1"):
        w4a16_gluon._check_tile(w4a16_gluon.GATE_THEN_UP_TILE, 2048, 1, 2048, "gemm2", "I")
    w4a16_gluon._check_tile(w4a16_gluon.GATE_THEN_UP_TILE, 6144, 1, 6144, "gemm1", "H")
    # nor a producer warp group, a form of gemm1 alone, whose consumers keep LOOKAHEAD quarters in flight
    with pytest.raises(ValueError, match="keeps 1 quarter"):
        w4a16_gluon.launch(*[None] * 9, splits=1, k_per_split=6144, counters=None, pdl=False,
                           tile=w4a16_gluon.PRODUCER_TILES[0], lookahead=2)  # fmt: skip
    with pytest.raises(ValueError, match="a form of gemm1"):
        w4a16_gluon._check_tile(w4a16_gluon.PRODUCER_TILES[0], 2048, 1, 2048, "gemm2", "I")
    w4a16_gluon._check_tile(w4a16_gluon.PRODUCER_TILES[0], 6144, 1, 6144, "gemm1", "H")


def test_applies_only_where_it_runs(monkeypatch):
    cuda = torch.device("cuda")
    ok = {"layout": "kernel_wgmma", "k_size": 6144, "tile": w4a16_gluon.TILE, "dtype": torch.bfloat16}

    def applies(device=cuda, **changes):
        return w4a16_gluon.applies(device, **{**ok, **changes})

    monkeypatch.setattr(w4a16_gluon, "interpreting", lambda: False)
    monkeypatch.setattr(w4a16_gluon, "available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("SGLANG_GLM5_GLUON_GEMM1", raising=False)
    assert applies(), "on by default for a config marked Gluon"
    assert not applies(dtype=torch.float16), "bf16 only: the kernels' wgmma would read fp16 as bf16"
    assert not applies(tile=dataclasses.replace(w4a16_gluon.TILE, gluon=False)), "only a config marked Gluon"
    monkeypatch.setenv("SGLANG_GLM5_GLUON_GEMM1", "0")
    assert not applies(), "the switch off: the Triton kernel"
    monkeypatch.setenv("SGLANG_GLM5_GLUON_GEMM1", "1")
    assert not applies(torch.device("cpu"))
    assert not applies(layout="kernel"), "the wgmma operand layout only"
    assert not applies(k_size=6144 + 64), "whole K steps of 256"
    producer = w4a16_gluon.PRODUCER_TILES[0]
    assert applies(tile=producer) is w4a16_gluon.producer_available()
    monkeypatch.setattr(w4a16_gluon, "producer_available", lambda: False)
    assert not applies(tile=producer), "a Triton without warp_specialize: the Triton kernel"
    assert applies(), "the copy-issuing form still runs"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert not applies(), "SM120 has no wgmma"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(w4a16_gluon, "interpreting", lambda: True)
    assert not applies()


EP8 = MoeShape(num_experts=32, hidden=6144, inter=2048, global_experts=256)  # GLM-5 under 8-way expert parallelism
H200 = 132  # SMs


# (bucket of tokens per expert, whether the Gluon tiles are offered, whether with other split plans)
OFFERS = [
    (Fraction(1, 32), True, True),  # GLM-5 B = 1: split plans of the Gluon tile
    (Fraction(1, 4), True, True),
    (1, True, False),  # B = 32: its own tile, unsplit (the blocks fill the GPU)
    (8, True, False),  # B = 256: the last bucket it is offered at (GLUON_MAX_BUCKET)
    (16, False, False),  # from here on the leading tile in Gluon instead (prefill_forms)
    (64, False, False),  # chunked prefill, B = 2048
]


@pytest.mark.parametrize("bucket,offered,split", OFFERS, ids=lambda v: str(v))
def test_tuner_offers_the_gluon_tiles_at_decode_buckets(bucket, offered, split, monkeypatch):
    monkeypatch.setattr(w4a16_gluon, "available", lambda: True)
    triton_tile = GemmConfig(16, 128, 256, 4, 3)
    num_pairs = EP8.tokens_at(bucket) * EP8.top_k
    for kernel in ("gemm1", "gemm2"):
        found = w4a16_plan.split_candidates(
            kernel, triton_tile, EP8, bucket, H200, w4a16_plan.STEP_SPLIT_TRIALS, arch=90
        )
        gluon = [c for c in found if c.gluon]
        if bucket > w4a16_plan.GLUON_MAX_BUCKET:  # chunked prefill: the leading tile itself in Gluon (gemm1), not TILES
            assert gluon == w4a16_gluon.prefill_forms(kernel, triton_tile)
            assert bool(gluon) is (kernel in w4a16_gluon.PREFILL_KERNELS)
            gluon = [c for c in gluon if c.without_plan() in w4a16_gluon.TILES[kernel]]
        assert bool(gluon) is (offered and bool(w4a16_gluon.TILES[kernel])), "its tiles, up to GLUON_MAX_BUCKET"
        assert all(not c.stream for c in gluon)
        if gluon:
            assert set(w4a16_gluon.TILES[kernel]) <= set(gluon), "each tile with the default plan"
            assert {c.without_plan() for c in gluon} == set(w4a16_gluon.TILES[kernel])
            assert (len(gluon) > len(w4a16_gluon.TILES[kernel])) is split
            for tile in w4a16_gluon.TILES[kernel]:
                plans = [w4a16_plan.plan_gemms(MoeConfig(c, c), num_pairs, 32, 256, 6144, 2048, H200) for c in gluon
                         if c.without_plan() == tile]  # fmt: skip
                counts = [p.gemm1.splits if kernel == "gemm1" else p.gemm2.splits for p in plans]
                assert len(set(counts)) == len(counts), "one trial per split count"
        without = w4a16_plan.split_candidates(kernel, triton_tile, EP8, bucket, H200, w4a16_plan.STEP_SPLIT_TRIALS)
        assert [c for c in found if not c.gluon] == without, "the Triton trials as without Gluon"
        assert not [c for c in w4a16_plan.split_candidates(kernel, triton_tile, EP8, bucket, H200, arch=120) if c.gluon]


def test_prefill_forms_are_the_tile_itself_in_gluon():
    tile = GemmConfig(128, 128, 128, 8, 3)
    gluon = dataclasses.replace(tile, gluon=True)
    extra = list(w4a16_gluon.PREFILL_TILES)
    own = [gluon, dataclasses.replace(gluon, gate_then_up=True)]
    assert w4a16_gluon.prefill_forms("gemm1", tile) == own + extra
    assert w4a16_gluon.prefill_forms("gemm2", tile) == [], "the Gluon gemm2 measured slower at prefill sizes"
    deep = GemmConfig(128, 256, 64, 8, 3)
    assert w4a16_gluon.prefill_forms("gemm1", deep) == extra, "a K step the kernels cannot take: the extra tiles only"
    assert w4a16_gluon.prefill_forms("gemm1", gluon) == extra, "already in Gluon: the extra tiles only"
    assert w4a16_gluon.prefill_forms("gemm1", extra[0]) == [], "nothing beside itself"
    same = dataclasses.replace(extra[0], gluon=False, gate_then_up=False)
    assert w4a16_gluon.prefill_forms("gemm1", same).count(extra[0]) == 1, "an extra tile that is a form: once"
    assert all(t.gluon and t.gluon_takes and t.block_m > 16 for t in extra)
    found = w4a16_plan.split_candidates("gemm1", tile, EP8, 256, H200, w4a16_plan.STEP_SPLIT_TRIALS, arch=90)
    assert found == (w4a16_gluon.prefill_forms("gemm1", tile) if w4a16_gluon.runs_on(90) else [])


@pytest.mark.parametrize("gemm1", [w4a16_gluon.TILE, w4a16_gluon.PRODUCER_TILES[0]], ids=lambda t: t.label)
def test_a_gluon_config_runs_the_triton_kernel_where_gluon_does_not(gemm1, gen, device):
    # The interpreter (CI) and every GPU but sm_90 run a config marked Gluon (with a producer warp group or not) as the
    # Triton kernels: the same bits as the same tiles unmarked.
    if device.type == "cuda":
        pytest.skip("the fallback is what the interpreter runs")
    layer = random_layer(8, 512, 128, gen)
    bundle = Nvfp4MoeWeights.build(*layer.args()).for_device()
    x = torch.randn(3, 512, generator=gen).bfloat16()
    weights, ids = random_routing(3, 8, 4, gen)
    tile = dataclasses.replace(w4a16_gluon.TILE, programs_per_sm=1)
    plain = dataclasses.replace(tile, gluon=False)
    gemm1 = dataclasses.replace(gemm1, programs_per_sm=1)
    got = moe.fused_moe(x, bundle, weights, ids, config=MoeConfig(gemm1, tile), num_global_experts=64)
    want = moe.fused_moe(x, bundle, weights, ids, config=MoeConfig(plain, plain), num_global_experts=64)
    assert torch.equal(got, want)


def _gpu_case(device: torch.device, monkeypatch) -> None:
    if device.type != "cuda" or routing.interpreting():
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    major, minor = torch.cuda.get_device_capability(device)
    if 10 * major + minor != 90 or not w4a16_gluon.available():
        pytest.skip("the Gluon gemm1 runs on sm_90 only")
    monkeypatch.delenv("SGLANG_GLM5_GLUON_GEMM1", raising=False)


def _config(per_sm: int, gemm1: GemmConfig = w4a16_gluon.TILE) -> MoeConfig:
    """Gluon tiles (gemm2's the larger) split for ``per_sm`` programs an SM (0: unsplit)."""
    plan = {"programs_per_sm": per_sm, "split_k": 0 if per_sm else 1}
    return MoeConfig(dataclasses.replace(gemm1, **plan), dataclasses.replace(w4a16_gluon.GEMM2_TILE, **plan))


def _ids(num_tokens: int, top_k: int, experts: torch.Tensor, gen: torch.Generator, idle: int = 0) -> torch.Tensor:
    """Each token but the first ``idle``: 1 to top_k distinct experts of ``experts``; the other slots -1."""
    ids = torch.full((num_tokens, top_k), -1, dtype=torch.int32)
    for t in range(idle, num_tokens):
        n = int(torch.randint(1, min(top_k, experts.numel()) + 1, (1,), generator=gen))
        ids[t, torch.randperm(top_k, generator=gen)[:n]] = experts[torch.randperm(experts.numel(), generator=gen)[:n]]
    return ids


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).norm() / want.norm()).item()


# (tokens, active experts of 8, tokens with no local slot): H = 1024 (4 K steps of 256), I = 512 (gemm1: 8 N tiles of
# 64; gemm2: 2 K steps)
GPU_CASES = [(1, 1, 0), (2, 2, 0), (4, 8, 1)]


@pytest.mark.parametrize("gemm1", w4a16_gluon.TILES["gemm1"], ids=lambda t: t.label)  # each tile the tuner offers
@pytest.mark.parametrize("per_sm", [0, 2])  # 0: unsplit; 2: split over K as the op does (the tile's aim)
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"T{c[0]}-active{c[1]}-idle{c[2]}")
def test_op_with_gluon_gemm1_matches_reference_and_repeats(case, per_sm, gemm1, gen, device, monkeypatch):
    _gpu_case(device, monkeypatch)
    num_tokens, active, idle = case
    layer = random_layer(8, 1024, 512, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    assert bundle.layout == "kernel_wgmma"
    x = torch.randn(num_tokens, 1024, generator=gen).bfloat16()
    weights, _ = random_routing(num_tokens, 8, 4, gen)
    ids = _ids(num_tokens, 4, torch.randperm(8, generator=gen)[:active].to(torch.int32), gen, idle)
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    args = (x.to(device), bundle, weights.to(device), ids.to(device))
    kw = {"check_ids": False, "num_global_experts": 64, "config": _config(per_sm, gemm1)}
    calls = []
    for name in ("launch", "launch_gemm2"):
        launch = getattr(w4a16_gluon, name)
        monkeypatch.setattr(w4a16_gluon, name, lambda *a, _f=launch, _n=name, **k: calls.append((_n, k["splits"],
                            k["tile"])) or _f(*a, **k))  # fmt: skip
    out = moe.fused_moe(*args, **kw)
    assert [c[0] for c in calls] == ["launch", "launch_gemm2"], "the op must have taken both Gluon GEMMs"
    assert (calls[0][1] > 1) is (per_sm > 0), "gemm1 split as asked"
    assert calls[0][2].without_plan() == gemm1, "gemm1 launched with the config's tile and order"
    calls.clear()
    off = moe.fused_moe(*args, **kw, settings=dataclasses.replace(w4a16_plan.PlanSettings(), gluon=False))
    assert not calls and _rel(off, want) < 1e-2, "switched off, the Triton kernels run the same config"
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-2
    assert torch.equal(moe.fused_moe(*args, **kw), out), "the same call twice must give the same bits"
    if idle:
        assert torch.equal(out[:idle].float().cpu(), torch.zeros_like(out[:idle].float().cpu()))


@pytest.mark.parametrize("tile", w4a16_gluon.TILES["gemm1"], ids=lambda t: t.label)  # both orders, either copy form
@pytest.mark.parametrize("splits", [1, 3])
def test_gives_the_triton_gemm1_bits_with_the_same_split(splits, tile, gen, device, monkeypatch):
    # The same decode, dots, K order and split sum as the Triton kernel with the same tile: the same h, bit for bit.
    _gpu_case(device, monkeypatch)

    layer = random_layer(8, 1536, 256, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    x = torch.randn(3, 1536, generator=gen).bfloat16().to(device)
    ids = _ids(3, 4, torch.randperm(8, generator=gen)[:3].to(torch.int32), gen).to(device)
    xp = torch.empty_like(x)
    route = routing.route_pairs(ids, 8, 16, permute=(x, xp), layout=bundle.layout)
    k_splits = w4a16_plan.k_splits(1536, 256, splits)
    counters = torch.zeros(w4a16_gluon.counters_needed(route.block_expert.numel(), 256), dtype=torch.int32,
                           device=device)  # fmt: skip
    args = (xp, bundle.w13, bundle.w13_scale, bundle.w13_scale_2, route)
    h_triton = torch.zeros(ids.numel(), 256, dtype=torch.bfloat16, device=device)
    h_gluon = torch.zeros_like(h_triton)
    launch = w4a16_plan.Launch(route.block_expert.numel(), *k_splits)
    triton_tile = dataclasses.replace(tile, gluon=False, gate_then_up=False, producer=False)
    w4a16.launch_gemm1(*args, h_triton, triton_tile, 4, *bundle.gate_up_rows, False, launch=launch,
                       counters=counters, layout=bundle.layout)  # fmt: skip
    w4a16_gluon.launch(*args, h_gluon, 4, *bundle.gate_up_rows, splits=k_splits[0], k_per_split=k_splits[1],
                       counters=counters, pdl=False, tile=tile)  # fmt: skip
    valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
    assert torch.equal(h_gluon[valid], h_triton[valid])


# (I, K splits, N tiles per program): EP8-like split and unsplit, and TP8's I = 256 with several tiles a program
GEMM2_CASES = [(512, 1, 1), (512, 2, 1), (256, 1, 4)]


@pytest.mark.parametrize("inter,splits,per_program", GEMM2_CASES, ids=lambda v: str(v))
def test_gemm2_gives_the_triton_bits_with_the_same_grid(inter, splits, per_program, gen, device, monkeypatch):
    _gpu_case(device, monkeypatch)
    layer = random_layer(8, 768, inter, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    ids = _ids(3, 4, torch.randperm(8, generator=gen)[:3].to(torch.int32), gen).to(device)
    weights, _ = random_routing(3, 8, 4, gen)
    route = routing.route_pairs(ids, 8, 16)
    h = torch.randn(ids.numel(), inter, generator=gen).bfloat16().to(device)
    tile = w4a16_gluon.GEMM2_TILE
    launch = w4a16_plan.Launch(route.block_expert.numel(), *w4a16_plan.k_splits(inter, 256, splits))
    shape = (splits, ids.numel(), 768) if splits > 1 else (ids.numel(), 768)
    dtype = torch.float32 if splits > 1 else torch.bfloat16
    args = (h, bundle.w2, bundle.w2_scale, bundle.w2_scale_2, weights.reshape(-1).to(device), route)
    ys = []
    for cfg in (dataclasses.replace(tile, gluon=False), tile):
        y = torch.zeros(shape, dtype=dtype, device=device)
        w4a16.launch_gemm2(*args, y, cfg, False, per_program, launch=launch, layout=bundle.layout)
        ys.append(y)
    valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
    assert ys[0].abs().amax() > 0
    assert torch.equal(ys[1][..., valid, :], ys[0][..., valid, :])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replays_with_one_expert_then_all(gen, device, monkeypatch):
    # The grid and the split are fixed at capture; the blocks in use come from the device.
    _gpu_case(device, monkeypatch)
    layer = random_layer(8, 1024, 512, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    x = torch.empty(4, 1024, dtype=torch.bfloat16, device=device)
    weights = torch.empty(4, 4, device=device)
    ids = torch.empty(4, 4, dtype=torch.int32, device=device)
    kw = {"check_ids": False, "num_global_experts": 64, "config": _config(2)}

    def fill(active: int):
        w, _ = random_routing(4, 8, 4, gen)
        x.copy_(torch.randn(4, 1024, generator=gen).bfloat16())
        weights.copy_(w)
        ids.copy_(_ids(4, 4, torch.randperm(8, generator=gen)[:active].to(torch.int32), gen, idle=1))

    fill(1)
    moe.fused_moe(x, bundle, weights, ids, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, bundle, weights, ids, **kw)
    for active in (1, 8, 1):
        fill(active)
        graph.replay()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), weights.cpu(), ids.cpu())
        assert _rel(out, want) < 1e-2, f"{active} active experts"


# Prefill tiles (routing blocks of 64-128 pairs, the wgmma's N; one or two warp groups): (tile, tokens). 150 tokens
# x 4 slots over 8 experts is about 75 pairs an expert: one full 64-row block and one part-filled, or one 128-row block
# part-filled; 5 tokens leave most rows of every block as padding.
PREFILL_TILES = ["128x128x256-w8-s2-gl-gu", "128x128x128-w8-s3-gl", "128x128x128-w8-s3-gl-gu", "64x128x128-w8-s3-gl",
                 "128x64x128-w4-s3-gl", "64x64x128-w4-s4-gl"]  # fmt: skip


@pytest.mark.parametrize("tokens", [150, 5])
@pytest.mark.parametrize("label", PREFILL_TILES)
def test_prefill_tiles_match_reference_and_the_triton_kernels(label, tokens, gen, device, monkeypatch):
    _gpu_case(device, monkeypatch)
    layer = random_layer(8, 1024, 512, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    x = torch.randn(tokens, 1024, generator=gen).bfloat16()
    weights, ids = random_routing(tokens, 8, 4, gen)
    want = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    tile = GemmConfig.from_label(label)
    gemm2 = dataclasses.replace(tile, gate_then_up=False)
    args = (x.to(device), bundle, weights.to(device), ids.to(device))
    kw = {"check_ids": False, "path": "w4a16"}
    calls = []
    for name in ("launch", "launch_gemm2"):
        launch = getattr(w4a16_gluon, name)
        monkeypatch.setattr(w4a16_gluon, name, lambda *a, _f=launch, _n=name, **k: calls.append(_n) or _f(*a, **k))
    out = moe.fused_moe(*args, config=MoeConfig(tile, gemm2), **kw)
    assert calls == ["launch", "launch_gemm2"], "the op must have taken both Gluon GEMMs"
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-2
    assert torch.equal(moe.fused_moe(*args, config=MoeConfig(tile, gemm2), **kw), out), "the same bits twice"
    plain = MoeConfig(
        dataclasses.replace(tile, gluon=False, gate_then_up=False), dataclasses.replace(gemm2, gluon=False)
    )
    triton_out = moe.fused_moe(*args, config=plain, **kw)
    assert _rel(out, triton_out.cpu().double()) < 1e-3, "the Triton kernels with the same tile"


@pytest.mark.parametrize("splits", [1, 2])
def test_the_grid_order_gives_the_same_bits(splits, gen, device, monkeypatch):
    # N tiles first or blocks first (the launch's blocks_last; the prefill tiles take N tiles first): the same
    # programs, so the same h, bit for bit, split or not (the split counters are indexed by the grid's order).
    _gpu_case(device, monkeypatch)
    layer = random_layer(8, 1024, 512, gen)
    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).for_device()
    x = torch.randn(150, 1024, generator=gen).bfloat16().to(device)
    _, ids = random_routing(150, 8, 4, gen)
    tile = GemmConfig.from_label("64x128x128-w8-s3-gl")
    xp = torch.empty_like(x)
    route = routing.route_pairs(ids.to(device), 8, tile.block_m, permute=(x, xp), layout=bundle.layout)
    k_splits = w4a16_plan.k_splits(1024, tile.block_k, splits)
    outs = []
    for blocks_last in (False, True):
        counters = torch.zeros(w4a16_gluon.counters_needed(route.block_expert.numel(), 512, tile), dtype=torch.int32,
                               device=device)  # fmt: skip
        h = torch.zeros(ids.numel(), 512, dtype=torch.bfloat16, device=device)
        w4a16_gluon.launch(xp, bundle.w13, bundle.w13_scale, bundle.w13_scale_2, route, h, 4, *bundle.gate_up_rows,
                           splits=k_splits[0], k_per_split=k_splits[1], counters=counters, pdl=False, tile=tile,
                           blocks_last=blocks_last)  # fmt: skip
        assert not counters.any(), "the last program of each tile leaves its counter zero"
        outs.append(h)
    assert outs[0].abs().amax() > 0
    assert torch.equal(outs[0], outs[1])
