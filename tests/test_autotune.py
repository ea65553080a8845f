"""The config cache (lookup order, robustness, concurrent writes) and the tuner's pruning."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import multiprocessing as mp
from fractions import Fraction

import pytest
import torch

from sglang_glm5 import autotune, tiles, tuner, variants
from sglang_glm5.autotune import ConfigCache, Entry, cache_key, gemm_shape, m_bucket
from sglang_glm5.hardware import TARGETS, resolve
from sglang_glm5.moe import nvfp4_fused_moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.shapes import MoeShape
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16_plan, w4a16_tiles

SM120 = TARGETS["rtx-pro-6000"]
SHAPE = MoeShape(num_experts=4, hidden=64, inter=32, top_k=2)
SMALL = GemmConfig(16, 32, 64, 2, 2)
TOO_BIG_FOR_SM120 = GemmConfig(128, 128, 128, 8, 4)  # 181248 B compiled for sm_120


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    autotune.clear_reports()
    return tmp_path


def _entry(cfg: GemmConfig, shared: int = 20000) -> Entry:
    return Entry(cfg, shared, 0.5, "test")


def _key(kernel: str, bucket: int, measured: bool = True) -> str:
    return cache_key(SM120, kernel, gemm_shape(kernel, SHAPE), bucket, measured=measured)


def test_m_bucket():
    assert [m_bucket(v) for v in (0.2, 1, 1.5, 3, 16, 17, 10**6)] == [1, 1, 2, 4, 16, 32, autotune.MAX_BUCKET]


def test_decode_buckets_go_below_one_token_per_expert():
    # GLM-5 decode under EP8: B tokens per step are B * 8 / 256 tokens per expert, 1/32 at B = 1.
    from fractions import Fraction

    assert [autotune.bucket_of(b * 8 / 256) for b in (1, 2, 4, 8, 16, 17, 32)] == [
        Fraction(1, 32), Fraction(1, 16), Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), 1, 1,
    ]  # fmt: skip
    assert autotune.bucket_of(1e-4) == autotune.MIN_BUCKET and autotune.bucket_of(3) == m_bucket(3) == 4
    assert autotune.parse_bucket("1/32") == Fraction(1, 32) and type(autotune.parse_bucket("16")) is int
    assert autotune.tune_buckets([0.03, 0.25, 3, 0.031]) == [Fraction(1, 32), Fraction(1, 4), 4]
    assert _key("gemm1", Fraction(1, 32)).endswith("|m=1/32")
    for bad in ("0", "-1/2", "x"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            autotune.parse_bucket(bad)


def test_a_tuned_decode_step_is_read_at_that_step_only_and_the_octave_bucket_serves_the_rest(tmp_path):
    # GLM-5 B = 3 (EP8 or TP8) is 3/32 tokens per expert: its own step, inside the octave bucket 1/8 (B = 3, 4).
    steps = (1, 2, 3, 4, 9, 16)
    assert [autotune.step_of(b * 8 / 256) for b in steps] == [Fraction(b, 32) for b in steps]
    assert autotune.step_of(17 * 8 / 256) is None and autotune.step_of(1e-4) == autotune.MIN_BUCKET
    assert autotune.step_of(2.5 / 32) == Fraction(3, 32)  # rounded up, as buckets are
    assert autotune.tune_buckets([3 / 32, 0.07, 0.5, 9 / 32, 3]) == [
        Fraction(3, 32), Fraction(9, 32), Fraction(1, 2), 4,
    ]  # fmt: skip
    path = tmp_path / "c.json"
    octave, step = GemmConfig(16, 64, 256, 4, 3), GemmConfig(16, 64, 128, 4, 3, programs_per_sm=1)
    shape = MoeShape(num_experts=32, hidden=64, inter=32, top_k=8, global_experts=256)
    key = lambda b: cache_key(SM120, "gemm1", gemm_shape("gemm1", shape), b, measured=True)  # noqa: E731
    autotune.store(path, SM120, {key(Fraction(1, 8)): _entry(octave), key(Fraction(3, 32)): _entry(step)})
    cache = ConfigCache(SM120, [path])
    assert cache.lookup(shape, 3 / 32).gemm1 == step  # the step's own entry, its split plan kept
    assert cache.lookup(shape, 2.5 / 32).gemm1 == step
    assert cache.lookup(shape, 4 / 32).gemm1 == octave  # B = 4: its bucket 1/8, not the neighbouring step
    assert cache.lookup(shape, 2 / 32).gemm1 == octave  # 1/16 untuned: borrows 1/8 (one octave), as before
    # Without a step entry a lookup is what it was before steps existed: the octave bucket's entry.
    octave_only = tmp_path / "octave.json"
    autotune.store(octave_only, SM120, {key(Fraction(1, 8)): _entry(octave)})
    assert ConfigCache(SM120, [octave_only]).lookup(shape, 3 / 32).gemm1 == octave


def test_decode_lookups_borrow_only_decode_buckets_nearby(tmp_path):
    # An entry tuned at 1/8 serves 1/32 and 1/4; 1/2 is one octave from m=1 and two from 1/8, so the
    # nearer m=1 entry serves it; m=1 (every expert busy) does not reach 1/32 (three octaves).
    from fractions import Fraction

    path = tmp_path / "c.json"
    decode, busy = GemmConfig(16, 64, 256, 4, 3), GemmConfig(16, 128, 256, 4, 3)
    autotune.store(path, SM120, {_key("gemm1", Fraction(1, 8)): _entry(decode), _key("gemm1", 1): _entry(busy)})
    cache = ConfigCache(SM120, [path])
    assert cache.lookup(SHAPE, 1 / 32).gemm1 == decode
    assert cache.lookup(SHAPE, 1 / 4).gemm1 == decode
    assert cache.lookup(SHAPE, 1 / 2).gemm1 == busy
    assert cache.lookup(SHAPE, 1).gemm1 == busy
    assert ConfigCache(SM120, [tmp_path / "none.json"]).lookup(SHAPE, 1 / 32) == w4a16_tiles.heuristic_config(1 / 32)


def test_a_repeated_lookup_skips_the_bucket_arithmetic(tmp_path, monkeypatch):
    # The op looks its tiles up on every call: a value seen before is answered from the memo, without the Fraction
    # arithmetic of bucket_of / step_of (tens of microseconds a call on the GPU machines' hosts); the answer is the
    # one the bucket path gave, and a new value still takes that path.
    path = tmp_path / "c.json"
    decode = GemmConfig(16, 64, 256, 4, 3)
    autotune.store(path, SM120, {_key("gemm1", Fraction(1, 8)): _entry(decode)})
    cache = ConfigCache(SM120, [path])
    first = cache.lookup(SHAPE, 3 / 256)
    buckets = []
    bucket_of = autotune.bucket_of
    monkeypatch.setattr(autotune, "bucket_of", lambda m: buckets.append(m) or bucket_of(m))
    assert cache.lookup(SHAPE, 3 / 256) is first and first.gemm1 == decode
    assert buckets == []
    assert cache.lookup(SHAPE, 5 / 256).gemm1 == decode
    assert buckets == [5 / 256]


def test_tune_takes_fractional_batch_sizes_and_w4a4_refuses_them(tmp_path, capsys):
    from sglang_glm5.cli import main

    out = tmp_path / "out.json"
    argv = ["tune", "--shape", "4,64,32", "--batch-sizes", "1/32,0.5", "--out", str(out), "--no-survey"]
    assert main(argv) == 0
    keys = set(json.loads(out.read_text())["entries"])
    assert {k.rsplit("|m=", 1)[1] for k in keys} == {"1/32", "1/2"}
    assert main(["tune", "--path", "w4a4", "--shape", "4,64,32", "--batch-sizes", "1/2", "--out", str(out)]) == 2
    assert "--batch-sizes must be whole tokens per expert" in capsys.readouterr().err


def test_tune_names_an_out_it_cannot_write_before_tuning(tmp_path, capsys, monkeypatch):
    # A folder as --out once failed with IsADirectoryError after the whole tune (minutes of compiles on a GPU).
    from sglang_glm5 import tuner
    from sglang_glm5.cli import main

    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("tuned before checking --out"))
    (tmp_path / "a_file").write_text("")
    for out, text in [(tmp_path, "a folder; expected a file"), (tmp_path / "a_file" / "c.json", "is a file, not a")]:
        assert main(["tune", "--shape", "8,64,32", "--batch-sizes", "1", "--out", str(out), "--no-survey"]) == 2
        assert text in capsys.readouterr().err


def test_user_cache_wins_over_shipped_then_heuristic(tmp_path):
    user, shipped = tmp_path / "user.json", tmp_path / "shipped.json"
    other = GemmConfig(32, 64, 128, 4, 2)
    autotune.store(shipped, SM120, {_key("gemm1", 1): _entry(other), _key("gemm2", 1): _entry(other)})
    autotune.store(user, SM120, {_key("gemm1", 1): _entry(SMALL)})
    cfg = ConfigCache(SM120, [user, shipped]).lookup(SHAPE, 1)
    assert cfg.gemm1 == SMALL and cfg.gemm2 == other
    assert ConfigCache(SM120, [tmp_path / "none.json"]).lookup(SHAPE, 1) == w4a16_tiles.heuristic_config(1)


def test_untuned_bucket_takes_the_nearest_tuned_one_then_the_heuristic(tmp_path):
    path = tmp_path / "c.json"
    other = GemmConfig(16, 128, 128, 4, 3)
    autotune.store(path, SM120, {_key("gemm1", 16): _entry(SMALL), _key("gemm1", 64): _entry(other)})
    cache = ConfigCache(SM120, [path])
    assert cache.lookup(SHAPE, 16).gemm1 == SMALL
    assert cache.lookup(SHAPE, 8).gemm1 == SMALL  # one power of two away
    assert cache.lookup(SHAPE, 4).gemm1 == SMALL  # two away: still the nearest
    assert cache.lookup(SHAPE, 32).gemm1 == other  # a tie between 16 and 64 goes to the larger
    assert cache.lookup(SHAPE, 256).gemm1 == other
    assert cache.lookup(SHAPE, 512) == w4a16_tiles.heuristic_config(512)  # three away from 64: too far
    assert cache.lookup(SHAPE, 2) == w4a16_tiles.heuristic_config(2)
    assert cache.lookup(SHAPE, 16).gemm2 == w4a16_tiles.heuristic_config(16).gemm2  # no gemm2 entry at all


def _run_op_with(cache: ConfigCache, gen) -> None:
    """The op with whatever the cache gives still matches the reference."""
    layer = random_layer(SHAPE.num_experts, SHAPE.hidden, SHAPE.inter, gen)
    x = torch.randn(3, SHAPE.hidden, generator=gen).bfloat16()
    weights, ids = random_routing(3, SHAPE.num_experts, SHAPE.top_k, gen)
    args = (x, *layer.args(), weights, ids)
    out = nvfp4_fused_moe(*args, config=cache.lookup(SHAPE, 1.5))
    ref = nvfp4_fused_moe_reference(*args)
    assert ((out.double() - ref).norm() / ref.norm()) < 1e-2


def test_truncated_file_is_reported_once_and_skipped_then_repaired(tmp_path, caplog, gen):
    path = tmp_path / "c.json"
    autotune.store(path, SM120, {_key("gemm1", 2): _entry(SMALL)})
    path.write_text(path.read_text()[:40])
    with caplog.at_level(logging.WARNING, logger="sglang_glm5.autotune"):
        cache = ConfigCache(SM120, [path])
        ConfigCache(SM120, [path])
    assert sum("not valid JSON" in r.message for r in caplog.records) == 1
    assert cache.lookup(SHAPE, 2) == w4a16_tiles.heuristic_config(2)
    _run_op_with(cache, gen)
    autotune.store(path, SM120, {_key("gemm2", 2): _entry(SMALL)})  # a write repairs the file
    assert set(json.loads(path.read_text())["entries"]) == {_key("gemm2", 2)}


def test_unknown_keys_and_unfit_configs_are_skipped(tmp_path, caplog, gen):
    path = tmp_path / "c.json"
    good = _entry(SMALL).as_json()
    unknown = {**good, "config": {**good["config"], "swizzle": 4}}  # a field GemmConfig does not have
    unfit = {**_entry(TOO_BIG_FOR_SM120).as_json(), "shared_bytes": 181248}
    path.write_text(json.dumps({"entries": {_key("gemm1", 2): unknown, _key("gemm2", 2): unfit}, "extra": 1}))
    with caplog.at_level(logging.WARNING, logger="sglang_glm5.autotune"):
        cache = ConfigCache(SM120, [path])
    assert cache.entries == {}
    text = " ".join(r.message for r in caplog.records)
    assert "malformed entry" in text and "exceeds rtx-pro-6000's 101376 B" in text
    _run_op_with(cache, gen)


def test_a_one_k_step_entry_where_k_takes_several_steps_is_skipped(tmp_path, caplog, gen):
    # A gemm2 tile marked one_k_step runs only where I fits one K step (its shared memory was checked for that form
    # alone): under a shape with a deeper I, or as gemm1, the lookup passes it over instead of the op raising.
    path = tmp_path / "c.json"
    one = GemmConfig(16, 32, 64, 2, 2, one_k_step=True)
    deep = MoeShape(num_experts=4, hidden=64, inter=128, top_k=2)
    narrow = MoeShape(num_experts=4, hidden=32, inter=32, top_k=2)  # H = 32: one N tile of 32 rows
    entries = {_key_of("gemm2", deep, 2): _entry(one), _key("gemm1", 2): _entry(one), _key("gemm2", 2): _entry(one),
               _key_of("gemm2", narrow, 2): _entry(one)}  # fmt: skip
    autotune.store(path, SM120, entries)
    with caplog.at_level(logging.WARNING, logger="sglang_glm5.autotune"):
        cache = ConfigCache(SM120, [path])
        assert cache.lookup(deep, 2).gemm2 == w4a16_tiles.heuristic_config(2).gemm2
        assert cache.lookup(narrow, 2).gemm2 == w4a16_tiles.heuristic_config(2).gemm2
        assert cache.lookup(SHAPE, 2) == tiles.MoeConfig(w4a16_tiles.heuristic_config(2).gemm1, one)  # I = 32: one step
    text = " ".join(r.message for r in caplog.records)
    assert "is a gemm2 tile for K <= 64 and N > 32, got N = 64, K = 128" in text
    assert "is a gemm2 tile for K <= 64 and N > 32, got N = 32, K = 32" in text
    assert "is a one-K-step gemm2 tile, got it for gemm1" in text
    _run_op_with(cache, gen)


def test_w4a16_entry_with_block_k_below_64_is_reported_once_and_skipped(tmp_path, caplog, gen):
    """GemmConfig allows block_k 32, the W4A16 kernels do not: such an entry made every call raise."""
    path = tmp_path / "c.json"
    shallow = GemmConfig(16, 32, 32, 2, 2)
    with pytest.raises(ValueError, match="block_k must be >= 64"):  # what the op does with it
        _run_op_with(_FixedCache(tiles.MoeConfig(shallow, SMALL)), gen)
    # The same config as a W4A4 entry: that family has no such rule, so it stays readable there.
    w4a4_key = cache_key(SM120, "gemm1", gemm_shape("gemm1", SHAPE), 2, measured=True, variant=variants.get("w4a4"))
    entries = {_key("gemm1", 2): _entry(shallow), _key("gemm2", 2): _entry(SMALL), w4a4_key: _entry(shallow)}
    autotune.store(path, SM120, entries)
    with caplog.at_level(logging.WARNING, logger="sglang_glm5.autotune"):
        cache = ConfigCache(SM120, [path])
        want = tiles.MoeConfig(w4a16_tiles.heuristic_config(2).gemm1, SMALL)
        for _ in range(2):  # a second cache (another device) reads it again: still reported once
            assert ConfigCache(SM120, [path]).lookup(SHAPE, 2) == want
        assert cache.lookup(SHAPE, 2, "w4a4").gemm1 == shallow
    assert (
        sum(f"skipping {_key('gemm1', 2)!r}: config: block_k must be >= 64" in r.message for r in caplog.records) == 1
    )
    _run_op_with(cache, gen)


class _FixedCache:
    def __init__(self, cfg: tiles.MoeConfig):
        self.cfg = cfg

    def lookup(self, shape, tokens_per_expert):
        return self.cfg


def test_batch_sizes_are_rounded_to_the_buckets_lookups_read(tmp_path, capsys):
    """`tune --batch-sizes 100` stored m=100 entries, which no lookup reads (they read m=128)."""
    from sglang_glm5.cli import main

    out = tmp_path / "out.json"
    assert main(["tune", "--shape", "4,64,32", "--batch-sizes", "100,128", "--out", str(out), "--no-survey"]) == 0
    assert "--batch-sizes 100,128 -> buckets 128" in capsys.readouterr().out
    offline = {_key("gemm1", 128, measured=False), _key("gemm2", 128, measured=False)}  # unmeasured: per architecture
    assert set(json.loads(out.read_text())["entries"]) == offline
    stored = ConfigCache(SM120, [out]).entries
    assert ConfigCache(SM120, [out]).lookup(SHAPE, 100).gemm1 == stored[_key("gemm1", 128, measured=False)].config


def test_both_tune_paths_get_the_rounded_buckets(monkeypatch, tmp_path):
    """Rounded once, in the tune command, for W4A16 and W4A4 alike (one tuner over the family's record):
    deduplicated and ascending."""
    from sglang_glm5.cli import main

    seen = {}

    def tune(target, shape, buckets, bench, *, variant, **kwargs):
        seen[variant.name] = list(buckets)
        return {}, tuner.TuneReport()

    monkeypatch.setattr(tuner, "tune", tune)
    for path in ("w4a16", "w4a4"):
        argv = ["tune", "--path", path, "--shape", "4,64,32", "--batch-sizes", "100,3,128,4,5000"]
        assert main([*argv, "--out", str(tmp_path / "out.json")]) == 0
    assert seen == {"w4a16": [4, 128, autotune.MAX_BUCKET], "w4a4": [4, 128, autotune.MAX_BUCKET]}
    assert autotune.tune_buckets([]) == []


def _writer(path: str, worker: int) -> None:
    items = {f"t|sm_120|gemm1|E=1,N=1,K=1|m={worker}-{i}": _entry(SMALL) for i in range(25)}
    for key, entry in items.items():
        autotune.store(__import__("pathlib").Path(path), SM120, {key: entry})


def test_two_processes_writing_at_once_keep_every_entry(tmp_path):
    path = tmp_path / "shared.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 50


def test_tuner_never_benchmarks_an_infeasible_config(monkeypatch):
    space = [SMALL, GemmConfig(16, 64, 64, 4, 4), TOO_BIG_FOR_SM120, GemmConfig(128, 128, 256, 8, 4)]
    variant = dataclasses.replace(variants.get("w4a16"), search_space=lambda bucket: space)
    calls = []

    def fake_bench(kernel, cfg, bucket):
        shared = w4a16_tiles.compiled_shared_bytes(kernel, cfg, SM120)
        assert SM120.fits(shared), f"benchmarked {cfg.label}: {shared} B does not fit sm_120"
        calls.append((kernel, cfg))
        return 1.0 / cfg.block_n  # the widest feasible tile wins

    entries, report = tuner.tune(SM120, SHAPE, [1], fake_bench, variant=variant)
    assert report.candidates == 8 and report.pruned == 4 and report.benchmarked == 4 == len(calls)
    assert report.pruned_by_model >= 2  # the 256-deep tile never reaches the compiler
    assert entries[_key("gemm1", 1)].config == GemmConfig(16, 64, 64, 4, 4)
    assert entries[_key("gemm1", 1)].ms == pytest.approx(1 / 64)
    assert "4 pruned as infeasible" in report.summary()


EP8 = MoeShape(num_experts=32, hidden=6144, inter=2048, global_experts=256)  # GLM-5 under 8-way expert parallelism
TP8 = MoeShape(num_experts=256, hidden=6144, inter=256)


def _splits(kernel: str, cfg: GemmConfig, shape: MoeShape, bucket, sms: int = 132) -> int:
    """The K splits the op's plan gives ``cfg`` at the step the tuner times for ``bucket``."""
    plan = w4a16_plan.plan_gemms(tiles.MoeConfig(cfg, cfg), shape.tokens_at(bucket) * shape.top_k, shape.num_experts,
                                 shape.all_experts, shape.hidden, shape.inter, sms)  # fmt: skip
    return (plan.gemm1 if kernel == "gemm1" else plan.gemm2).splits


@pytest.mark.parametrize(
    "shape, kernel, bucket, cfg",
    [
        (EP8, "gemm1", Fraction(1, 32), GemmConfig(16, 64, 256, 4, 3)),  # B = 1: one expert, 24 K steps
        (EP8, "gemm1", Fraction(1, 32), GemmConfig(16, 64, 128, 4, 3)),  # 48 K steps: up to 16 splits
        (EP8, "gemm2", Fraction(1, 32), GemmConfig(16, 64, 256, 4, 3)),  # K = I = 2048: 8 steps
        (TP8, "gemm1", Fraction(1, 4), GemmConfig(16, 128, 256, 4, 3)),  # B = 8 of TP8: 64 slots
    ],
)
def test_split_candidates_aim_the_same_tiles_split_elsewhere(shape, kernel, bucket, cfg):
    found = w4a16_plan.split_candidates(kernel, cfg, shape, bucket, 132)
    streams = [c for c in found if c.stream]
    found = [c for c in found if not c.stream]
    # gemm1 also as a stream-K schedule at each of the tried program counts, the tile unchanged
    want = [dataclasses.replace(cfg, stream=n) for n in w4a16_plan.STREAM_TRIALS] if kernel == "gemm1" else []
    assert streams == want
    assert found, "a decode bucket with K steps to spare has other split plans to try"
    counts = [_splits(kernel, c, shape, bucket) for c in found]
    for c in found:
        assert dataclasses.replace(c, programs_per_sm=0) == cfg and c.programs_per_sm in w4a16_plan.SPLIT_TRIALS
        assert not c.split_k, "a target for the call's plan, not a count fixed for every step of the bucket"
    planned = _splits(kernel, cfg, shape, bucket)
    assert planned not in counts and len(set(counts)) == len(counts), "each candidate launches another split"
    assert min(counts) < planned, "one program per SM (fewer splits) is among them: faster at GLM-5 B = 16 (run 22)"
    # The split follows the step: at B = 1 (1/32) a target of 1 still splits K; nearer busy it does not.
    if bucket == Fraction(1, 32):
        assert min(counts) > 1


def test_no_split_candidates_where_the_split_is_not_the_calls_to_make():
    cfg = GemmConfig(16, 64, 256, 4, 3)
    assert w4a16_plan.split_candidates("gemm1", cfg, EP8, 1, 132) == []  # busy experts: no split at all
    assert w4a16_plan.split_candidates("gemm1", dataclasses.replace(cfg, split_k=4), EP8, Fraction(1, 32), 132) == []
    assert (
        w4a16_plan.split_candidates("gemm1", dataclasses.replace(cfg, programs_per_sm=1), EP8, Fraction(1, 32), 132)
        == []
    )
    assert w4a16_plan.split_candidates("gemm1", dataclasses.replace(cfg, stream=2), EP8, Fraction(1, 32), 132) == []
    # TP8's gemm2 (K = I = 256) walks several N tiles per program and does not split.
    assert w4a16_plan.split_candidates("gemm2", cfg, TP8, Fraction(1, 32), 132) == []


def test_one_k_step_tiles_are_offered_for_gemm2_where_i_is_one_step():
    # Above 64 tokens per expert the tuner times gemm2's one-step tiles beside its leaders where I fits one K step
    # (GLM-5 TP8, I = 256) and H makes 2+ N tiles, never for gemm1 or where I takes several steps (EP8, I = 2048),
    # nor at 64 and below.
    lead = GemmConfig(64, 256, 256, 8, 3)
    found = [c for c in w4a16_plan.split_candidates("gemm2", lead, TP8, 256, 132) if c.one_k_step]
    assert found == list(w4a16_plan.ONE_STEP_TILES)
    assert not [c for c in w4a16_plan.split_candidates("gemm2", lead, EP8, 256, 132) if c.one_k_step]
    narrow = MoeShape(num_experts=256, hidden=256, inter=256)  # one N tile of 256 rows: only the 128-row ones
    assert {c.block_n for c in w4a16_plan.split_candidates("gemm2", lead, narrow, 256, 132) if c.one_k_step} == {128}
    assert not [c for c in w4a16_plan.split_candidates("gemm1", lead, TP8, 256, 132) if c.one_k_step]
    assert not [c for c in w4a16_plan.split_candidates("gemm2", lead, TP8, 64, 132) if c.one_k_step]
    # a one-step tile keeps 2+ N tiles a program however few blocks the call has (its only form)
    one = w4a16_plan.ONE_STEP_TILES[0]
    plan = w4a16_plan.plan_gemms(tiles.MoeConfig(lead, one), 8, TP8.num_experts, TP8.all_experts, TP8.hidden, TP8.inter,
                                 132)  # fmt: skip
    assert plan.per_program >= 2 and plan.gemm2.splits == 1
    assert w4a16_plan.plan_gemms(tiles.MoeConfig(lead, lead), 8, TP8.num_experts, TP8.all_experts, TP8.hidden,
                                 TP8.inter, 132).per_program == 1  # fmt: skip


# (B tokens of GLM-5 TP8, gemm2's N tiles per program): as many as fit in 8 K steps (8 at I = 256 in one step of
# 256), halved while the launch would have fewer than MULTI_TILE_PROGRAMS_PER_SM programs an SM on 132 SMs; measured
# on the H200 at real routing (run 37): B = 2 and 4 faster with 2 and 4 tiles than with 4 and 8.
TP8_DECODE_TILES = [(1, 1), (2, 2), (4, 4), (8, 8), (16, 8), (256, 8)]


@pytest.mark.parametrize("batch,per_program", TP8_DECODE_TILES)
def test_gemm2_tiles_per_program_keep_five_programs_an_sm_at_tp8_decode(batch, per_program):
    step = GemmConfig(16, 64, 256, 4, 3)  # the h200 cache's TP8 decode gemm2 tile: I = 256 in one K step
    plan = w4a16_plan.plan_gemms(tiles.MoeConfig(step, step), batch * 8, TP8.num_experts, TP8.all_experts, TP8.hidden,
                                 TP8.inter, 132)  # fmt: skip
    assert plan.per_program == per_program


def test_a_split_target_and_a_fixed_split_count_exclude_each_other():
    with pytest.raises(ValueError, match="programs_per_sm"):
        GemmConfig(16, 64, 256, 4, 3, split_k=2, programs_per_sm=1)
    with pytest.raises(ValueError, match="programs_per_sm"):
        GemmConfig(16, 64, 256, 4, 3, programs_per_sm=99)
    assert GemmConfig(16, 64, 256, 4, 3, programs_per_sm=1).label == "16x64x256-w4-s3-p1"
    # a stream-K schedule has no split plan: neither a count nor a target beside it
    for kwargs in ({"split_k": 2}, {"programs_per_sm": 1}):
        with pytest.raises(ValueError, match="stream-K schedule"):
            GemmConfig(16, 64, 256, 4, 3, stream=2, **kwargs)
    assert GemmConfig(16, 64, 256, 4, 3, stream=3).label == "16x64x256-w4-s3-sk3"


def test_tuner_times_the_leading_tiles_with_other_split_plans_and_keeps_a_winning_one(tmp_path):
    space = [GemmConfig(16, 64, 256, 4, 3), GemmConfig(16, 64, 128, 4, 3), GemmConfig(16, 128, 256, 4, 3),
             GemmConfig(16, 128, 128, 4, 3)]  # fmt: skip
    variant = dataclasses.replace(
        variants.get("w4a16"),
        search_space=lambda bucket: space,
        compiled_shared_bytes=lambda jobs, target: [w4a16_tiles.model_shared_bytes(k, c, target) for k, c in jobs],
    )  # the shared bytes from the model: this test is about the timing, not the compiler
    calls = []

    def cost(cfg):
        # 128-deep tiles lead, then narrow ones; 16x128x256 is the slowest tile (if it fits sm_120) and gets
        # no second look. Any other split plan beats the default, one program per SM most.
        tile = (1.0 if cfg.block_k == 128 else 2.0) + cfg.block_n / 1e3
        return tile + (0.01 * cfg.programs_per_sm if cfg.programs_per_sm else 0.5)

    def fake_bench(kernel, cfg, bucket):
        calls.append((kernel, cfg))
        return cost(cfg)

    bucket = Fraction(1, 32)
    entries, report = tuner.tune(SM120, EP8, [bucket], fake_bench, variant=variant)
    assert report.benchmarked == len(calls)
    for kernel in ("gemm1", "gemm2"):
        timed = [cfg for k, cfg in calls if k == kernel]
        tiles_first = list(itertools.takewhile(lambda c: not (c.programs_per_sm or c.stream), timed))
        assert len(tiles_first) >= 3 and set(tiles_first) <= set(space), "every fitting tile first, default plan"
        leaders = sorted(tiles_first, key=cost)[: tuner.SPLIT_LEADERS]
        retimed = timed[len(tiles_first) :]
        assert retimed and all(c.programs_per_sm or c.stream for c in retimed)
        plain = {c: dataclasses.replace(c, programs_per_sm=0, stream=0) for c in retimed}
        assert set(plain.values()) == set(leaders)
        for tile in leaders:
            want = w4a16_plan.split_candidates(kernel, tile, EP8, bucket, SM120.sm_count)
            assert [c for c in retimed if plain[c] == tile] == want
            assert any(c.stream for c in want) == (kernel == "gemm1"), "gemm1 also as a stream-K schedule"
        best = entries[_key_of(kernel, EP8, bucket)].config
        assert best == dataclasses.replace(space[1], programs_per_sm=1)
    assert report.split_trials == sum(1 for _, c in calls if c.programs_per_sm or c.stream) > 0
    assert f"({report.split_trials} of them split-plan trials)" in report.summary()
    # A stored split plan is what the op reads back at its bucket; a bucket that borrows the entry (none of its
    # own) gets the tile with the default plan.
    path = tmp_path / "tuned.json"
    autotune.store(path, SM120, entries)
    cache = ConfigCache(SM120, [path])
    cfg = cache.lookup(EP8, 1 / 32)
    assert cfg.gemm1.programs_per_sm == 1 and cfg.gemm1 == entries[_key_of("gemm1", EP8, bucket)].config
    assert cache.lookup(EP8, 1 / 16).gemm1 == dataclasses.replace(cfg.gemm1, programs_per_sm=0)


@pytest.mark.parametrize("target, stored", [("h200", True), ("rtx-pro-6000", False)])
def test_tuner_times_one_k_step_tiles_and_stores_one_that_fits_and_wins(target, stored):
    # At TP8's 256 tokens per expert the one-K-step gemm2 tiles come after the search space's leaders, with their own
    # shared memory (here the model's, standing in for the compiler): a winner is stored where it fits (sm_90), and
    # on sm_120 (101376 B) none is timed at all.
    t = TARGETS[target]
    space = [GemmConfig(64, 128, 128, 8, 3), GemmConfig(64, 128, 64, 4, 3)]
    variant = dataclasses.replace(
        variants.get("w4a16"),
        search_space=lambda bucket: space,
        compiled_shared_bytes=lambda jobs, target: [w4a16_tiles.model_shared_bytes(k, c, target) for k, c in jobs],
    )
    calls = []

    def fake_bench(kernel, cfg, bucket):
        calls.append((kernel, cfg))
        return 1.0 if cfg.one_k_step else 2.0 + cfg.block_k / 1e3

    entries, _ = tuner.tune(t, TP8, [256], fake_bench, variant=variant)
    one_step = [c for k, c in calls if c.one_k_step]
    assert all(k == "gemm2" for k, c in calls if c.one_k_step)
    fitting = {c for c in w4a16_plan.ONE_STEP_TILES if t.fits(w4a16_tiles.model_shared_bytes("gemm2", c, t))}
    assert set(one_step) == fitting
    assert bool(one_step) == stored
    best = entries[cache_key(t, "gemm2", gemm_shape("gemm2", TP8), 256, measured=True)].config
    assert best.one_k_step == stored and not entries[cache_key(t, "gemm1", gemm_shape("gemm1", TP8), 256,
                                                               measured=True)].config.one_k_step  # fmt: skip


def test_a_borrowed_entry_leaves_a_fixed_split_count_behind(tmp_path):
    path = tmp_path / "c.json"
    fixed = GemmConfig(16, 64, 256, 4, 3, split_k=5)
    h200 = TARGETS["h200"]
    key = cache_key(h200, "gemm1", gemm_shape("gemm1", EP8), Fraction(1, 32), measured=True)
    autotune.store(path, h200, {key: _entry(fixed)})
    cache = ConfigCache(h200, [path])
    assert cache.lookup(EP8, 1 / 32).gemm1 == fixed
    assert cache.lookup(EP8, 1 / 8).gemm1 == dataclasses.replace(fixed, split_k=0)


def test_splits_only_times_the_tile_in_use_with_each_split_count_and_keeps_the_fastest(tmp_path, monkeypatch):
    # The tile a lookup picks at the step (its octave bucket's entry here: 12/32 is in bucket 1/2; tiles_in_use leaves
    # the entry's split plan behind) is timed with the default plan and each other split count; the step's entry
    # keeps the fastest. TP8's gemm2 walks several N tiles per program and never splits: nothing to time, no entry.
    h200 = TARGETS["h200"]
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "shipped_dir", lambda: tmp_path / "shipped")  # its step entries would come first
    tile = GemmConfig(16, 128, 256, 4, 3)
    stored = {
        cache_key(h200, k, gemm_shape(k, shape), Fraction(1, 2), measured=True): _entry(
            dataclasses.replace(tile, programs_per_sm=1)
        )
        for k in ("gemm1", "gemm2")
        for shape in (EP8, TP8)
    }
    autotune.store(autotune.user_cache_path(h200), h200, stored)
    calls = []

    def fake_bench(kernel, cfg, bucket):  # the more programs per SM the faster; the default plan slowest
        calls.append((kernel, cfg, bucket))
        return 1.0 - cfg.programs_per_sm / 100

    step = Fraction(12, 32)
    for shape in (EP8, TP8):
        calls.clear()
        entries, report = tuner.tune(h200, shape, [step], fake_bench, tiles=autotune.tiles_in_use(h200, shape))
        defaults = 0
        for kernel in ("gemm1", "gemm2"):
            # with the Gluon kernels' trials where this Triton has Gluon
            trials = w4a16_plan.split_candidates(kernel, tile, shape, step, h200.sm_count, w4a16_plan.STEP_SPLIT_TRIALS,
                                                 arch=h200.arch)  # fmt: skip
            key = cache_key(h200, kernel, gemm_shape(kernel, shape), step, measured=True)
            timed = [cfg for k, cfg, _ in calls if k == kernel]
            if shape is TP8 and kernel == "gemm2":  # no split plans; the Gluon tiles (default plans) only
                assert all(c.gluon and not c.has_plan for c in trials) and key not in entries
                assert timed == ([tile, *trials] if trials else [])
                defaults += bool(trials)
                continue
            assert timed == [tile, *trials] and len(trials) >= 2, "the default plan, then one per other count"
            defaults += 1
            best = max(trials, key=lambda c: c.programs_per_sm)
            assert entries[key].config == best and entries[key].ms == 1.0 - best.programs_per_sm / 100
        assert {b for _, _, b in calls} == {step}
        assert report.benchmarked == report.split_trials + defaults == len(calls)
    # A plan less than SPLIT_MARGIN faster than the default is within the timing spread: the default stays.
    entries, _ = tuner.tune(h200, EP8, [step], lambda k, cfg, b: 1.0 - (cfg.programs_per_sm > 0) / 200,
                               tiles=autotune.tiles_in_use(h200, EP8))  # fmt: skip
    assert [e.config for e in entries.values()] == [tile, tile]
    with pytest.raises(ValueError, match="needs the target's GPU"):
        tuner.tune(h200, EP8, [step], None, tiles=autotune.tiles_in_use(h200, EP8))


def test_splits_only_stores_a_winning_trial_of_another_tile_with_its_own_shared_bytes(tmp_path, monkeypatch):
    # A trial need not share the tile in use's shared memory (the Gluon gemm1's tile is another tile): the tuner asks
    # the family for its size once per tile and stores that with the entry.
    h200 = TARGETS["h200"]
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "shipped_dir", lambda: tmp_path / "shipped")
    tile, other = GemmConfig(16, 128, 256, 4, 3), GemmConfig(16, 64, 256, 4, 3, gluon=True)
    sizes = {tile: 40000, other: 70000}
    asked = []

    def shared_bytes(items, target):
        asked.extend(c for _, c in items)
        return [sizes[c.without_plan()] for _, c in items]

    variant = dataclasses.replace(
        variants.get("w4a16"), kernels=("gemm1",), compiled_shared_bytes=shared_bytes,
        model_shared_bytes=lambda kernel, cfg, target: 0,
        split_candidates=lambda kernel, cfg, shape, bucket, sms, targets=(), arch=None: [
            other, dataclasses.replace(other, programs_per_sm=1)],
    )  # fmt: skip
    entries, _ = tuner.tune(h200, EP8, [Fraction(3, 32)], lambda k, cfg, b: 0.5 if cfg.gluon else 1.0,
                               variant=variant, tiles=lambda kernel, bucket: tile)  # fmt: skip
    (entry,) = entries.values()
    assert entry.config.gluon and entry.shared_bytes == 70000
    assert asked.count(other) == 1, "one size per tile, whatever its plans"


def test_splits_only_trusts_the_compiler_over_the_model_for_a_chosen_tile(tmp_path, monkeypatch):
    # The analytic model is an upper bound for pruning searches: it put the h200 cache's own 64x128x256-w8-s3 gemm1
    # at 290816 B (compiled: 172032). A tile a lookup chose, and its forms, are checked by the compiler alone.
    h200 = TARGETS["h200"]
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "shipped_dir", lambda: tmp_path / "shipped")
    tile = GemmConfig(64, 128, 256, 8, 3)
    gluon = dataclasses.replace(tile, gluon=True)
    sizes = {tile: 172032, gluon: 208896, dataclasses.replace(gluon, gate_then_up=True): 300000}
    variant = dataclasses.replace(
        variants.get("w4a16"), kernels=("gemm1",), compiled_shared_bytes=lambda items, target: [
            sizes[c.without_plan()] for _, c in items], model_shared_bytes=lambda kernel, cfg, target: 290816,
        split_candidates=lambda kernel, cfg, shape, bucket, sms, targets=(), arch=None: [
            gluon, dataclasses.replace(gluon, gate_then_up=True)],
    )  # fmt: skip
    timed = []

    def bench(kernel, cfg, bucket):
        timed.append(cfg)
        return 0.9 if cfg.gluon else 1.0

    entries, _ = tuner.tune(h200, EP8, [256], bench, variant=variant, tiles=lambda kernel, bucket: tile)
    (entry,) = entries.values()
    assert entry.config == gluon and entry.shared_bytes == 208896
    assert timed == [tile, gluon], "the form the compiler puts over 232448 B is not timed"


def test_splits_only_stores_a_stream_k_plan_only_where_it_beats_the_default(tmp_path, monkeypatch):
    # With the split targets giving no other count (2 per SM is the default plan), gemm1's only other plans are the
    # stream-K ones: a step where none beats the default by SPLIT_MARGIN gets no gemm1 entry, one where one does
    # stores it.
    h200 = TARGETS["h200"]
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    # The tiles in use from the heuristic, not the shipped step entries (a Gluon tile there has no stream-K plans)
    monkeypatch.setattr(autotune, "shipped_dir", lambda: tmp_path / "shipped")
    variant = dataclasses.replace(variants.get("w4a16"), step_split_targets=(w4a16_plan.PROGRAMS_PER_SM,))
    step = Fraction(12, 32)
    tiles_now = autotune.tiles_in_use(h200, EP8)
    for faster, want in ((0.0, None), (0.1, 3)):

        def fake_bench(kernel, cfg, bucket, faster=faster):
            return 1.0 - faster * (cfg.stream == 3)

        entries, _ = tuner.tune(h200, EP8, [step], fake_bench, variant=variant, tiles=tiles_now)
        key = cache_key(h200, "gemm1", gemm_shape("gemm1", EP8), step, measured=True)
        if want is None:
            assert key not in entries
        else:
            assert entries[key].config == dataclasses.replace(tiles_now("gemm1", step), stream=want)


def test_splits_only_needs_the_local_gpu(capsys, monkeypatch):
    from sglang_glm5.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on any machine: no GPU of the target's here
    assert main(["tune", "--target", "h200", "--splits-only", "--batch-sizes", "3/32"]) == 2
    assert "--splits-only times K split plans of W4A16 on the target's own GPU" in capsys.readouterr().err


def _key_of(kernel: str, shape: MoeShape, bucket) -> str:
    return cache_key(SM120, kernel, gemm_shape(kernel, shape), bucket, measured=True)


def test_offline_tune_stores_feasible_unmeasured_picks():
    entries, report = tuner.tune(SM120, SHAPE, [1, 64], None)
    assert report.benchmarked == 0 and len(entries) == 4
    for entry in entries.values():
        assert entry.ms is None and SM120.fits(entry.shared_bytes)
        assert entry.as_json()["measured"] is False


def test_an_offline_pick_holds_the_programs_an_sm_its_launch_is_sized_for():
    """Without the GPU a decode tile keeps resident by shared memory the programs an SM its grid is sized for
    (w4a16_plan.resident_aim). On sm_120 (100 KB an SM) the heuristic's 3-stage 16x64x256 gemm1 takes 53248 B, one
    program where a split step aims for two: 2 stages (26624 B, three). gemm2 at EP8 (I = 2048, one N tile a program)
    holds two at 3 stages (36864 B) and stays; at TP8 (I = 256, several N tiles a program, aim 5) 2 stages (19456 B,
    five). On the H200 (228 KB an SM) and above 8 tokens per expert the heuristic's tiles stay as they are."""
    h200 = TARGETS["h200"]
    resident = SM120.programs_by_shared(53248), SM120.programs_by_shared(26624), h200.programs_by_shared(53248)
    assert resident == (1, 3, 4)
    ep8, tp8 = MoeShape(32, 6144, 2048, 8), MoeShape(256, 6144, 256, 8)
    for bucket in (Fraction(1, 32), 8, 16):
        want = w4a16_tiles.heuristic_config(bucket)
        for target, shape in itertools.product((SM120, h200), (ep8, tp8)):
            entries, _ = tuner.tune(target, shape, [bucket], None)
            picks = {k: entries[cache_key(target, k, gemm_shape(k, shape), bucket, measured=False)].config for k in
                     ("gemm1", "gemm2")}  # fmt: skip
            decode = target is SM120 and bucket <= 8
            stages = {"gemm1": 2 if decode else 3, "gemm2": 2 if decode and shape is tp8 else 3}
            for kernel, cfg in picks.items():
                assert cfg == dataclasses.replace(getattr(want, kernel), num_stages=stages[kernel]), (
                    target.name, shape, bucket, kernel)  # fmt: skip
    # A family without an aim (W4A4: no split grid) keeps the heuristic's tiles.
    assert variants.get("w4a4").resident_aim is None


def test_compiler_rules_where_the_upper_bound_is_loose(tmp_path, monkeypatch):
    """A tile the conservative model rejects for the H200 (233472 B > 232448 B) but that compiles within
    the limit is kept for benchmarking; one that cannot fit even at the floor never reaches the compiler."""
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    h200 = resolve("h200")
    loose, hopeless = GemmConfig(32, 128, 256, 4, 3), GemmConfig(128, 128, 512, 8, 4)
    assert not h200.fits(w4a16_tiles.model_shared_bytes("gemm1", loose, h200))
    assert h200.fits(w4a16_tiles.model_shared_floor("gemm1", loose))
    assert not h200.fits(w4a16_tiles.model_shared_floor("gemm1", hopeless))
    compiled = []

    def compiler(configs):
        compiled.extend(configs)
        return w4a16_tiles.compiled_shared_bytes_many([("gemm1", c) for c in configs], h200)

    report = tuner.TuneReport()
    kept = tuner.prune(
        [loose, hopeless], h200, report, lambda c: w4a16_tiles.model_shared_bytes("gemm1", c, h200), compiler,
        lambda c: w4a16_tiles.model_shared_floor("gemm1", c),
    )  # fmt: skip
    assert compiled == [loose] and report.pruned_by_model == 1
    assert [cfg for cfg, _ in kept] == [loose] and h200.fits(kept[0][1])
    # Without the compiler the upper bound decides alone.
    report = tuner.TuneReport()
    assert tuner.prune([loose], h200, report, lambda c: w4a16_tiles.model_shared_bytes("gemm1", c, h200), None) == []


# ---------------------------------------------------------------------------------------------
# Owners: unmeasured entries belong to an architecture and its shared memory, measured ones to a device.


def _shipped(name: str) -> dict:
    return json.loads((autotune.shipped_dir() / name).read_text())["entries"]


@pytest.mark.parametrize("name", ["rtx-pro-6000", "rtx-pro-6000-server", "rtx-pro-6000-maxq", "rtx-5090"])
def test_every_sm120_gpu_reads_the_shipped_sm120_entries(name):
    """The shipped rtx-pro-6000.json holds AOT-checked, unmeasured picks: facts about sm_120 and 101376 B,
    so a Server Edition, a Max-Q or an RTX 5090 reads them as the Workstation Edition does."""
    target = TARGETS[name]
    shipped = _shipped("rtx-pro-6000.json")
    assert shipped and all(v["measured"] is False for v in shipped.values())
    cache = ConfigCache(target)
    assert set(cache.entries) == set(shipped)
    shape = MoeShape(32, 6144, 2048, 8)  # glm5-ep8, one of the shipped shapes
    for bucket in (1, 64, 2048):
        key = cache_key(target, "gemm1", gemm_shape("gemm1", shape), bucket, measured=False)
        assert cache.lookup(shape, bucket).gemm1 == GemmConfig(**shipped[key]["config"])


@pytest.mark.parametrize("name", ["h200", "h100", "sm90", "b200", "sm121"])
def test_measured_entries_are_read_by_their_gpu_and_its_siblings_alone(name):
    """h200.json is measured on an H200: it and its sibling the H100 SXM (sm_90, 132 SMs, the same shared memory)
    read all of it; a generic sm_90 (SM count unknown) none; no other architecture or shared memory reads the sm_120
    entries."""
    target = resolve(name)
    measured = _shipped("h200.json")
    assert measured and all(v["measured"] is True for v in measured.values())
    want = set(measured) if name in ("h200", "h100") else set()
    assert set(ConfigCache(target).entries) == want


def test_a_gpu_prefers_its_own_measured_entry_to_its_siblings_and_theirs_to_the_architectures(tmp_path):
    h100, h200 = TARGETS["h100"], TARGETS["h200"]
    assert autotune.siblings(h100) == [h200] and autotune.siblings(TARGETS["a100"]) == []
    enk = gemm_shape("gemm1", SHAPE)
    mine, kin, arch = GemmConfig(16, 32, 64, 2, 2), GemmConfig(16, 64, 64, 4, 2), GemmConfig(32, 64, 128, 4, 2)
    path = tmp_path / "c.json"
    entries = {cache_key(h200, "gemm1", enk, 4, measured=True): _entry(kin),
               cache_key(h100, "gemm1", enk, 4, measured=False): Entry(arch, 20000, None, "test")}  # fmt: skip
    autotune.store(path, h200, entries)
    assert ConfigCache(h100, [path]).lookup(SHAPE, 4).gemm1 == kin
    autotune.store(path, h100, {cache_key(h100, "gemm1", enk, 4, measured=True): _entry(mine)})
    assert ConfigCache(h100, [path]).lookup(SHAPE, 4).gemm1 == mine
    assert ConfigCache(h200, [path]).lookup(SHAPE, 4).gemm1 == kin  # each its own first
    # Another SM count (an H100 PCIe: 114 SMs) is no sibling: the architecture's entry.
    pcie = dataclasses.replace(h100, name="h100-pcie", device_name="NVIDIA H100 PCIe", sm_count=114)
    assert ConfigCache(pcie, [path]).lookup(SHAPE, 4).gemm1 == arch


def test_measured_entry_wins_at_its_bucket_and_old_unmeasured_keys_are_still_read(tmp_path):
    """Unmeasured entries written by earlier versions sit under the device key: that target still reads
    them. At one bucket the device's measured entry comes before the architecture's unmeasured one."""
    path = tmp_path / "c.json"
    other = GemmConfig(32, 64, 128, 4, 2)
    old_style = {**_entry(other).as_json(), "measured": False, "ms": None}
    unmeasured = Entry(other, 20000, None, "test").as_json()
    data = {"entries": {_key("gemm1", 4): old_style, _key("gemm2", 4, measured=False): unmeasured}}
    path.write_text(json.dumps(data))
    cache = ConfigCache(SM120, [path])
    assert cache.lookup(SHAPE, 4) == tiles.MoeConfig(other, other)
    autotune.store(path, SM120, {_key("gemm2", 4): _entry(SMALL)})  # a measured gemm2 entry
    assert ConfigCache(SM120, [path]).lookup(SHAPE, 4) == tiles.MoeConfig(other, SMALL)
    server = TARGETS["rtx-pro-6000-server"]  # a sibling (188 SMs, the same shared memory): the device's entries too
    assert ConfigCache(server, [path]).lookup(SHAPE, 4) == tiles.MoeConfig(other, SMALL)
    five = TARGETS["rtx-5090"]  # 170 SMs: the arch entry is shared, the device ones are not
    assert ConfigCache(five, [path]).lookup(SHAPE, 4) == tiles.MoeConfig(w4a16_tiles.heuristic_config(4).gemm1, other)


def test_a_target_reads_its_architectures_entries_from_any_file_and_its_own_file_first(isolated_cache):
    """An offline tune for the Workstation Edition serves a Max-Q in the same user cache; in a folder the
    target's own file wins for the same key."""
    maxq = TARGETS["rtx-pro-6000-maxq"]
    other = GemmConfig(32, 64, 128, 4, 2)
    unmeasured = Entry(other, 20000, None, "test")
    autotune.store(autotune.user_cache_path(SM120), SM120, {_key("gemm1", 8, measured=False): unmeasured})
    assert ConfigCache(maxq).lookup(SHAPE, 8).gemm1 == other
    own = Entry(SMALL, 20000, None, "test")
    autotune.store(autotune.user_cache_path(maxq), maxq, {_key("gemm1", 8, measured=False): own})
    assert ConfigCache(maxq).lookup(SHAPE, 8).gemm1 == SMALL
    assert ConfigCache(SM120).lookup(SHAPE, 8).gemm1 == other
    files = autotune.cache_files(maxq)
    assert files[0] == autotune.user_cache_path(maxq) and autotune.user_cache_path(SM120) in files
    assert files.index(autotune.shipped_cache_path(SM120)) > files.index(autotune.user_cache_path(SM120))


def test_offline_tune_prints_per_gemm_the_candidates_and_what_shared_memory_rules_out(capsys):
    """`tune --target rtx-pro-6000` without that GPU: the counts, checked against compiling every candidate."""
    from sglang_glm5.cli import main

    # Bucket 2: some of gemm1's candidates overflow sm_120 (with Triton 3.8 every candidate of bucket 1 fits)
    assert main(["tune", "--target", "rtx-pro-6000", "--shape", "4,64,32", "--batch-sizes", "2"]) == 0
    out = capsys.readouterr().out
    space = w4a16_tiles.search_space(2)
    cut = 0
    for kernel in w4a16_tiles.KERNELS:
        shared = dict(
            zip(space, w4a16_tiles.compiled_shared_bytes_many([(kernel, c) for c in space], SM120), strict=True)
        )
        fit = {c: b for c, b in shared.items() if SM120.fits(b)}
        assert fit, "the test needs a space in which something fits"
        cut += len(space) - len(fit)
        largest = max(fit, key=lambda c: (c.block_m * c.block_n * c.block_k, c.num_stages, fit[c], c.label))
        line = next(line for line in out.splitlines() if line.startswith(f"tune: W4A16 {kernel}: "))
        head = f"tune: W4A16 {kernel}: {len(space)} candidates, "
        tail = (f" by the compiler for rtx-pro-6000 (sm_120, 101376 B per block), {len(fit)} fit; "
                f"largest feasible tile {largest.label} ({fit[largest]} B)")  # fmt: skip
        assert line.startswith(head) and line.endswith(tail), line
        by_model, by_compiler = (int(w) for w in line[len(head) : -len(tail)].split() if w.isdigit())
        # The model's floor rules out what cannot fit at any rate; the compiler the rest of the misfits.
        assert by_model == sum(not SM120.fits(w4a16_tiles.model_shared_floor(kernel, c)) for c in space)
        assert by_compiler == len(space) - len(fit) - by_model
    assert cut, "the test needs a space that the shared memory cuts"


@pytest.mark.parametrize("path", ["w4a16", "w4a4"])
def test_the_ops_pick_config_reads_the_shipped_cache_of_the_gpu(monkeypatch, path):
    """What a CUDA call asks for (no GPU here: the device is faked): the shipped sm_120 entries, per family."""
    from sglang_glm5 import hardware

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 7)
    monkeypatch.setattr(hardware, "detect", lambda *a: SM120)
    autotune.forget_device_caches()
    ep8 = MoeShape(32, 6144, 2048)
    got = autotune.pick_config(path, 1 / 32, ep8.num_experts, ep8.hidden, ep8.inter, torch.device("cuda", 7))
    autotune.forget_device_caches()  # cuda:7 was a fake
    assert got == ConfigCache(SM120).lookup(ep8, 1 / 32, path)
    if path == "w4a16":  # the shipped decode pick, not the heuristic
        key = cache_key(SM120, "gemm1", gemm_shape("gemm1", ep8), autotune.bucket_of(1 / 32), measured=False)
        assert got.gemm1 == ConfigCache(SM120).entries[key].config


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kernels", "gemm3"], "expected some of gemm1,gemm2"),  # a GEMM the path does not have
        (["--kernels", "gemm1", "--path", "w4a4"], "tunes its GEMMs together"),  # W4A4's threshold needs both
    ],
)
def test_tune_kernels_refuses_what_it_cannot_do(args, message, capsys, tmp_path, monkeypatch):
    from sglang_glm5 import cli

    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    assert cli.main(["tune", "--target", "rtx-pro-6000", *args]) != 0
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json")), "nothing tuned, nothing stored"
