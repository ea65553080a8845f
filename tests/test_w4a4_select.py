"""Wiring of the W4A4 path: resolve_path, the self-check record that gates "auto", the threshold,
`tune --path w4a4` offline, and the SGLang switch SGLANG_GLM5_MOE_PATH.

No SM12x GPU here: the device is faked where a rule depends on it (torch.cuda's capability, name and
hardware.detect), and the self-check runs on the CPU with the W4A4 kernels through the interpreter
(dot_scaled swapped for a decoded dot) or with a deliberately broken op.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from sglang_glm5 import autotune, hardware, w4a4, w4a4_select, w4a4_tune, w4a4_verify
from sglang_glm5.cli import main
from sglang_glm5.hardware import TARGETS
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.w4a4_select import GpuIdentity, resolve_path, write_record
from sglang_glm5.w4a4_verify import run_selfcheck

SM120 = TARGETS["rtx-pro-6000"]
PRO6000 = GpuIdentity(SM120.device_name, 120)
SHAPE = MoeShape(num_experts=8, hidden=256, inter=128, top_k=4)
CUDA = torch.device("cuda", 0)
SCALES = {"w13_input_scale": torch.ones(8, 2), "w2_input_scale": torch.ones(8)}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    for env in (w4a4_select.MIN_TOKENS_ENV, "SGLANG_GLM5_MOE_PATH"):
        monkeypatch.delenv(env, raising=False)
    w4a4_select.clear_memo()
    autotune.clear_reports()
    yield tmp_path
    w4a4_select.clear_memo()


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(target): torch.cuda and hardware.detect report that GPU as cuda:0."""

    def install(target: hardware.GpuTarget = SM120) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: divmod(target.arch, 10))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: target.device_name)
        monkeypatch.setattr(hardware, "detect", lambda *a: target)

    return install


def _pass(shape=SHAPE, tokens_per_expert=(64, 512), gpu=PRO6000):
    """A passing record, as the self-check writes it after running these sizes on the (faked) GPU:
    by default one size per heuristic W4A4 tile pair (64x64x128 up to 128, 128x128x128 above), both
    at or above the default threshold, so that auto may take W4A4 at any prefill size."""
    return write_record(gpu, shape, True, {}, device=CUDA, tokens_per_expert=tokens_per_expert)


def _store_w4a4_tiles(bucket: int, cfg: GemmConfig, shape=SHAPE) -> None:
    """What `tune --path w4a4` leaves in the user cache: W4A4 tiles for one bucket."""
    entries = {
        w4a4.cache_key(SM120, k, shape, bucket, measured=True): autotune.Entry(cfg, 40000, 0.1, "t")
        for k in w4a4.KERNELS
    }
    autotune.store(autotune.user_cache_path(SM120), SM120, entries)


# ---------------------------------------------------------------------------------------------
# resolve_path


def test_invalid_path_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"'auto', 'w4a16', 'w4a4', got 'w4a8'"):
        resolve_path("w4a8", torch.device("cpu"), 100, SHAPE)


@pytest.mark.parametrize("device", ["cpu", "sm90", "sm120"])
def test_w4a16_is_always_allowed(device, fake_gpu):
    if device != "cpu":
        fake_gpu(SM120 if device == "sm120" else TARGETS["h200"])
    dev = torch.device("cpu") if device == "cpu" else CUDA
    assert resolve_path("w4a16", dev, 1e6, SHAPE) == "w4a16"  # even without input scales


def test_w4a4_refused_off_sm12x(fake_gpu):
    with pytest.raises(RuntimeError, match="SM12x.*got cpu"):
        resolve_path("w4a4", torch.device("cpu"), 1e6, SHAPE, **SCALES)
    fake_gpu(TARGETS["h200"])
    with pytest.raises(RuntimeError, match="SM12x.*got sm_90"):
        resolve_path("w4a4", CUDA, 1e6, SHAPE, **SCALES)


def test_w4a4_needs_the_input_scales(fake_gpu):
    fake_gpu()
    with pytest.raises(RuntimeError, match="got None for w2_input_scale"):
        resolve_path("w4a4", CUDA, 1e6, SHAPE, w13_input_scale=torch.ones(8, 2))
    # Forced, it needs no self-check record (that gates "auto" only) and no threshold.
    assert resolve_path("w4a4", CUDA, 1, SHAPE, **SCALES) == "w4a4"


def test_auto_flips_to_w4a4_only_after_a_passing_record(fake_gpu):
    fake_gpu()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"  # SM120, prefill size, but unproven
    _pass()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT - 1, SHAPE, **SCALES) == "w4a16"  # decode size
    assert resolve_path("auto", CUDA, 1e6, SHAPE) == "w4a16"  # no input scales: W4A16
    write_record(PRO6000, SHAPE, False, {})  # a later failure takes the pass back
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert PRO6000.name not in json.dumps(json.loads(w4a4_select.record_path().read_text()))


def test_auto_never_w4a4_off_sm12x_even_with_a_record(fake_gpu):
    h200 = TARGETS["h200"]
    fake_gpu(h200)
    _pass(gpu=GpuIdentity(h200.device_name, 90))
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", torch.device("cpu"), 1e6, SHAPE, **SCALES) == "w4a16"


@pytest.mark.parametrize(
    "change",
    [
        {"name": "NVIDIA GeForce RTX 5090"},  # another GPU's record
        {"triton": "0.0.1"},  # another Triton version
        {"kernel_digest": "000000000000"},  # other kernel sources
        {"tiles_digest": "000000000000"},  # other tiles
    ],
)
def test_a_record_counts_only_for_this_gpu_triton_kernels_and_tiles(fake_gpu, change):
    fake_gpu()
    gpu = GpuIdentity(change.get("name", PRO6000.name), 120)
    _pass(gpu=gpu)
    path = w4a4_select.record_path()
    data = json.loads(path.read_text())
    key = w4a4_select.record_key(gpu, SHAPE)
    if "triton" in change:
        data[w4a4_select.record_key(gpu, SHAPE, change["triton"])] = data.pop(key)
    for field in ("kernel_digest", "tiles_digest"):
        if field in change:
            data[key][field] = change[field]
    path.write_text(json.dumps(data))
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"


def test_a_record_for_another_shape_does_not_enable_auto(fake_gpu):
    """A pass on glm5-mini says nothing about the GLM-5 EP8 layer (other tiles, other grids)."""
    fake_gpu()
    other = MoeShape(SHAPE.num_experts, SHAPE.hidden, 2 * SHAPE.inter)
    _pass(shape=other)
    assert resolve_path("auto", CUDA, 1e6, other, **SCALES) == "w4a4"  # the record does work, for its shape
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", CUDA, 1e6, (8, 512, 128), **SCALES) == "w4a16"  # another H


def test_the_matching_record_enables_auto_with_tuned_tiles(fake_gpu):
    """tune first, then the self-check: its record binds the tuned tiles, and auto runs them."""
    fake_gpu()
    tuned = GemmConfig(32, 64, 256, 4, 2)
    _store_w4a4_tiles(64, tuned)
    _pass(tokens_per_expert=(64,))
    assert w4a4.pick_config(64, 8, 256, 128, CUDA) == MoeConfig(tuned, tuned)
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"
    w4a4_select.clear_memo()  # a fresh process (the server) reads the same answer
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"


def test_a_record_made_before_the_w4a4_tiles_changed_does_not_enable_auto(fake_gpu):
    """selfcheck, then tune: the tiles the self-check ran at m=64 are gone, so the whole record is void,
    also at m=512, whose tiles did not change."""
    fake_gpu()
    _pass()
    assert resolve_path("auto", CUDA, 512, SHAPE, **SCALES) == "w4a4"
    _store_w4a4_tiles(64, GemmConfig(32, 64, 256, 4, 2))
    w4a4_select.clear_memo()  # the server starts after the tune
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", CUDA, 512, SHAPE, **SCALES) == "w4a16"
    _pass()  # the self-check run again after the tune
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"


def test_tiles_the_self_check_never_ran_stay_on_w4a16(fake_gpu):
    """Tuned tiles at a bucket the check did not run: auto uses them only where they equal a pair it ran."""
    fake_gpu()
    _store_w4a4_tiles(1024, GemmConfig(32, 64, 256, 4, 2))  # a pair nobody checked
    _store_w4a4_tiles(2048, w4a4.heuristic_config(512).gemm1)  # the pair the check runs at 512
    _pass()  # runs 64 and 512: heuristic tiles, unchanged by these entries
    assert resolve_path("auto", CUDA, 1024, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", CUDA, 2048, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 256, SHAPE, **SCALES) == "w4a4"  # heuristic: the pair run at 512


def test_selfcheck_names_the_buckets_auto_takes_and_the_tokens_that_would_cover_the_rest(fake_gpu):
    fake_gpu()
    _store_w4a4_tiles(1024, GemmConfig(32, 64, 256, 4, 2))
    _pass()
    text = w4a4_verify.coverage(SHAPE, CUDA)
    assert "picks W4A4 at m = 64, 128, 256, 512, 2048, 4096 tokens per expert" in text
    assert "stays on W4A16 at m = 1024" in text and "--tokens 2048" in text  # 1024 * E / k = 1024 * 8 / 4


def test_a_check_below_the_threshold_proves_nothing_for_prefill(fake_gpu):
    """`selfcheck --tokens 1` runs the m >= 64 tiles (64x64x128) too, at 2 tokens per expert: one partial
    block per expert, none of the multi-block work of prefill. It does not count."""
    fake_gpu()
    _pass(tokens_per_expert=(2, 16))
    assert w4a4.heuristic_config(2) == w4a4.heuristic_config(64)  # the same tiles...
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a16"  # ...but not run at a W4A4 size


def test_kernel_digest_covers_the_shared_sort_and_sum_kernels_and_the_op(monkeypatch, tmp_path):
    """The W4A4 path launches routing.align_pairs_by_expert and routing.sum_over_slots (kernels/nvfp4_moe.py)."""
    import importlib.util
    from types import SimpleNamespace

    before = w4a4_select.kernel_digest()
    find_spec = importlib.util.find_spec
    for module in ("sglang_glm5.moe", "sglang_glm5.kernels.nvfp4_moe"):
        edited = tmp_path / f"{module}.py"
        edited.write_bytes(Path(find_spec(module).origin).read_bytes() + b"\n# edited\n")
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, m=module, e=edited: SimpleNamespace(origin=str(e)) if name == m
                            else find_spec(name, *a))  # fmt: skip
        w4a4_select.clear_memo()  # the digest is memoized like the rest
        assert w4a4_select.kernel_digest() != before, module


def test_device_facts_are_memoized_until_cleared(fake_gpu):
    fake_gpu()
    _pass()
    path = w4a4_select.record_path()
    data = path.read_text()
    path.unlink()
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    # A record written behind resolve_path's back (not through write_record) is seen after clear_memo only.
    path.write_text(data)
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a4"


def test_a_broken_record_file_means_unproven_not_an_error(fake_gpu, caplog):
    fake_gpu()
    w4a4_select.record_path().write_text("{ not json")
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert "not valid JSON" in caplog.text


# ---------------------------------------------------------------------------------------------
# The threshold: env over the tuner's cache over the default.


def test_threshold_env_override(fake_gpu, monkeypatch):
    fake_gpu()
    _pass()
    monkeypatch.setenv(w4a4_select.MIN_TOKENS_ENV, "8")
    assert resolve_path("auto", CUDA, 8, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 7.9, SHAPE, **SCALES) == "w4a16"


@pytest.mark.parametrize("value", ["lots", "-4", "inf", "nan"])
def test_threshold_env_rejects_non_numbers(fake_gpu, monkeypatch, value):
    fake_gpu()
    monkeypatch.setenv(w4a4_select.MIN_TOKENS_ENV, value)
    with pytest.raises(ValueError, match=f"SGLANG_GLM5_W4A4_MIN_TOKENS: expected .* got '{value}'"):
        resolve_path("auto", CUDA, 100, SHAPE, **SCALES)


@pytest.mark.parametrize("stored", [256, 16])  # above and below the default
def test_threshold_from_the_tuner_cache(fake_gpu, stored):
    fake_gpu()
    other = (SHAPE.num_experts, SHAPE.hidden, 2 * SHAPE.inter)
    _pass()
    _pass(shape=other)
    w4a4.store_threshold(autotune.user_cache_path(SM120), SM120, SHAPE, stored, measured=True)
    assert resolve_path("auto", CUDA, stored - 1, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", CUDA, stored, SHAPE, **SCALES) == "w4a4"
    # Another layer shape has no stored threshold: the default.
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT, other, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT - 1, other, **SCALES) == "w4a16"


def test_tuner_found_w4a4_never_faster(fake_gpu):
    fake_gpu()
    _pass()
    w4a4.store_threshold(autotune.user_cache_path(SM120), SM120, SHAPE, None, measured=True)
    assert resolve_path("auto", CUDA, 1e12, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("w4a4", CUDA, 1, SHAPE, **SCALES) == "w4a4"  # forcing still works


def test_malformed_threshold_is_reported_and_the_default_used(fake_gpu, caplog):
    fake_gpu()
    _pass()
    path = autotune.user_cache_path(SM120)
    path.parent.mkdir(parents=True)
    key = w4a4.threshold_key(SM120, SHAPE, measured=True)
    path.write_text(json.dumps({w4a4.THRESHOLD_KEY: {key: {"min_tokens_per_expert": "many"}}}))
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, w4a4.MIN_TOKENS_PER_EXPERT - 1, SHAPE, **SCALES) == "w4a16"
    assert "skipping W4A4 threshold" in caplog.text


@pytest.mark.parametrize(
    "timings, want",
    [
        ({16: (1.0, 2.0), 64: (1.0, 0.9), 256: (2.0, 1.0)}, 64),  # W4A4 wins from 64 on
        ({16: (1.0, 0.5), 64: (1.0, 2.0), 256: (2.0, 1.0)}, 256),  # a win below a loss does not count
        ({16: (1.0, 0.5), 64: (1.0, 0.9), 256: (2.0, 2.5)}, None),  # loses at the largest: never
        ({16: (1.0, 1.0)}, None),  # a tie is not a win
        ({}, None),
    ],
)
def test_threshold_from_timings(timings, want):
    assert w4a4_tune.threshold_from_timings(timings) == want


# ---------------------------------------------------------------------------------------------
# The self-check (its logic on the CPU; the CLI refuses without an SM12x GPU).


def _interpreter_w4a4(*args):
    """The W4A4 kernels through the Triton interpreter, dot_scaled swapped for a decoded fp32 dot."""
    return w4a4._run(*args, w13_order="gate_up", config=None, emulate_dot=True)


def _selfcheck(w4a4_op, gen, tokens=(16, 40)) -> w4a4_verify.SelfCheckResult:
    lines = []
    result = run_selfcheck(SHAPE, tokens, torch.device("cpu"), gen, PRO6000, w4a4_op=w4a4_op, say=lines.append)
    print("\n".join(lines))
    assert len(lines) == 1 + len(tokens)  # the header and one row per token count
    return result


def test_selfcheck_pass_writes_the_record_and_auto_flips(fake_gpu, gen, monkeypatch):
    fake_gpu()
    monkeypatch.setenv(w4a4_select.MIN_TOKENS_ENV, "8")  # the interpreter runs 8 and 20 tokens per expert
    assert resolve_path("auto", CUDA, 20, SHAPE, **SCALES) == "w4a16"
    result = _selfcheck(_interpreter_w4a4, gen)
    assert result.passed, [r.problems for r in result.rows]
    for row in result.rows:
        assert row.w4a4_rms <= row.bound and row.vs_emulation < w4a4_verify.EMULATION_RMS and row.w4a16_rel < 1e-2
    rec = json.loads(result.record.read_text())[w4a4_select.record_key(PRO6000, SHAPE)]
    assert rec["passed"] is True and rec["shape"] == [8, 256, 128] and len(rec["rows"]) == 2
    assert [(c["tokens_per_expert"], c["bucket"]) for c in rec["checked"]] == [(8.0, 8), (20.0, 32)]
    assert {GemmConfig(**c["gemm1"]) for c in rec["checked"]} == {w4a4.heuristic_config(20).gemm1}
    assert resolve_path("auto", CUDA, 20, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 100, SHAPE, **SCALES) == "w4a4"  # the same tiles (64x64x128)
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"  # 128x128x128: never run by this check


@pytest.mark.parametrize(
    "broken, problem",
    [
        (lambda *a: _interpreter_w4a4(*a) * 1.25, "rms"),  # a scale off by 25%: beyond the bound
        (lambda *a: w4a4.nvfp4_fused_moe_w4a4_emulated(*a) * 1.03, "vs emulation"),  # within the bound, not the math
        (lambda *a: torch.full_like(a[0], float("nan")), "non-finite"),
    ],
    ids=["scaled", "slightly-off", "nan"],
)
def test_selfcheck_failure_writes_no_record_and_takes_back_a_pass(fake_gpu, gen, broken, problem):
    fake_gpu()
    _pass()  # an earlier pass on this GPU
    other = (SHAPE.num_experts, SHAPE.hidden, 2 * SHAPE.inter)
    _pass(shape=other)  # and one for another layer shape
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a4"
    result = _selfcheck(broken, gen, tokens=(24,))
    assert not result.passed
    assert any(problem in p for p in result.rows[0].problems), result.rows[0].problems
    assert json.loads(result.record.read_text()) == {}  # every pass of this GPU taken back
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("auto", CUDA, 1e6, other, **SCALES) == "w4a16"


def test_error_bound_ignores_experts_without_tokens(gen):
    """At decode sizes most experts get no token (an empty h): the bound is that of the routed ones."""
    x = torch.randn(3, 64, generator=gen)
    h = [torch.randn(5, 32, generator=gen, dtype=torch.float64), torch.zeros(0, 32, dtype=torch.float64)]
    a1, a2 = w4a4_verify.calibrated_input_scales(x, h)
    assert a2[1] == 1.0  # no amax to calibrate from
    with_empty = w4a4_verify.activation_error_bound(x, a1, h, a2)
    without = w4a4_verify.activation_error_bound(x, a1, h[:1], a2[:1])
    assert with_empty == without and 0 < with_empty.eps_h < 0.3


def test_selfcheck_cli_exits_2_off_sm12x(capsys):
    assert not torch.cuda.is_available(), "this test is for a machine without an SM12x GPU"
    assert main(["selfcheck", "--path", "w4a4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs an SM12x GPU" in err, err
    assert not w4a4_select.record_path().exists()


# ---------------------------------------------------------------------------------------------
# tune --path w4a4


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tune_offline_stores_aot_checked_unmeasured_picks_in_the_user_cache(capsys):
    shipped = autotune.shipped_cache_path(SM120)
    before = _digest(shipped)
    argv = ["tune", "--path", "w4a4", "--target", "rtx-pro-6000", "--shape", "8,256,128", "--batch-sizes", "64,512",
            "--no-survey"]  # fmt: skip
    assert main(argv) == 0
    assert _digest(shipped) == before, "the shipped cache must not change"
    data = json.loads(autotune.user_cache_path(SM120).read_text())
    shape = MoeShape(8, 256, 128)
    keys = {w4a4.cache_key(SM120, k, shape, b, measured=False): (k, b) for k in ("gemm1", "gemm2") for b in (64, 512)}
    assert set(data["entries"]) == set(keys)  # only W4A4 keys: the W4A16 entries are another command's
    for key, entry in data["entries"].items():
        kernel, bucket = keys[key]
        cfg = GemmConfig(**entry["config"])
        assert entry["measured"] is False and entry["ms"] is None
        assert cfg == getattr(w4a4.heuristic_config(bucket), kernel)  # the heuristic fits sm_120
        (compiled,) = w4a4.compiled_shared_bytes_many([(kernel, cfg)], 120)
        assert entry["shared_bytes"] == compiled and SM120.fits(compiled)
    threshold = data[w4a4.THRESHOLD_KEY][w4a4.threshold_key(SM120, shape, measured=False)]
    assert threshold["min_tokens_per_expert"] == w4a4.MIN_TOKENS_PER_EXPERT and threshold["measured"] is False
    assert "not measured" in capsys.readouterr().out
    # The op's config lookup reads these entries back.
    cache = autotune.ConfigCache(SM120)
    got = w4a4.cached_config(cache, shape, 300, w4a4.heuristic_config(1))
    assert got == w4a4.heuristic_config(300)


def test_w4a4_keys_survive_a_new_w4a16_kernel_revision(monkeypatch):
    before = w4a4.cache_key(SM120, "gemm1", SHAPE, 64, measured=True)
    w4a16_before = autotune.cache_key(SM120, "gemm1", (8, 256, 256), 64, measured=True)
    monkeypatch.setattr(autotune, "KERNEL_REVISION", 99)
    assert autotune.cache_key(SM120, "gemm1", (8, 256, 256), 64, measured=True) != w4a16_before  # W4A16 tiles retire
    assert w4a4.cache_key(SM120, "gemm1", SHAPE, 64, measured=True) == before  # W4A4 tiles stay
    monkeypatch.setattr(w4a4, "KERNEL_REVISION", w4a4.KERNEL_REVISION + 1)
    assert w4a4.cache_key(SM120, "gemm1", SHAPE, 64, measured=True) != before  # their own revision retires them


@pytest.mark.parametrize("target", ["local", "h200"])
def test_tune_w4a4_refuses_non_sm12x_in_one_line(target, capsys):
    assert main(["tune", "--path", "w4a4", "--target", target]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs an SM12x GPU" in err, err


def test_tuner_never_benchmarks_a_w4a4_config_that_overflows(monkeypatch):
    space = [
        GemmConfig(64, 64, 128, 4, 3),
        GemmConfig(128, 128, 128, 8, 3),
        GemmConfig(128, 128, 256, 8, 4),  # 149504 B in gemm1 on sm_120: over 101376
    ]
    monkeypatch.setattr(w4a4_tune, "search_space", lambda bucket: space)
    benched = []

    def fake_bench(kernel, cfg, bucket):
        (shared,) = w4a4.compiled_shared_bytes_many([(kernel, cfg)], 120)
        assert SM120.fits(shared), f"benchmarked {kernel} {cfg.label}: {shared} B"
        benched.append((kernel, cfg))
        return 1.0 / cfg.block_m  # the tallest feasible tile wins

    entries, report = w4a4_tune.tune(SM120, SHAPE, [256], fake_bench)
    assert report.candidates == 6 and report.pruned_by_model >= 1 and report.benchmarked == len(benched)
    assert ("gemm1", space[2]) not in benched
    assert entries[w4a4.cache_key(SM120, "gemm1", SHAPE, 256, measured=True)].config == space[1]
    assert entries[w4a4.cache_key(SM120, "gemm1", SHAPE, 256, measured=True)].ms == pytest.approx(1 / 128)
    with pytest.raises(ValueError, match="SM12x targets.*h200"):
        w4a4_tune.tune(TARGETS["h200"], SHAPE, [256], fake_bench)


def test_a_w4a4_candidate_that_fails_on_the_gpu_is_skipped(monkeypatch):
    """Never run on SM120: a candidate whose compile or launch fails there must not end the tune."""
    space = [GemmConfig(64, 64, 128, 4, 3), GemmConfig(128, 64, 128, 4, 3)]
    monkeypatch.setattr(w4a4_tune, "search_space", lambda bucket: space)

    def flaky_bench(kernel, cfg, bucket):
        if cfg.block_m == 128:
            raise RuntimeError("PassManager::run failed")
        return 1.0

    entries, report = w4a4_tune.tune(SM120, SHAPE, [256], flaky_bench)
    assert report.benchmarked == 2 and report.pruned_by_compiler == 2
    assert all(e.config == space[0] for e in entries.values())

    def broken_bench(kernel, cfg, bucket):
        raise RuntimeError("PassManager::run failed")

    with pytest.raises(RuntimeError, match="no W4A4 config of gemm1 ran on this GPU.*PassManager"):
        w4a4_tune.tune(SM120, SHAPE, [256], broken_bench)


def test_tune_help_says_what_path_does(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--path {w4a16,w4a4}" in out and "threshold" in out and "measured: false" in out


# ---------------------------------------------------------------------------------------------
# The SGLang switch: SGLANG_GLM5_MOE_PATH, checked at weight-processing time.


class _Method:
    _moe_runner_backend = "nvfp4_triton"  # what create_moe_runner caches for our backend
    load_up_proj_weight_first = False


class _Layer:
    """What process_weights_hook and apply_hook read: 8 experts, this rank (2 of 4) holding 4-5."""

    def __init__(self):
        self.num_experts, self.num_local_experts, self.moe_ep_rank = 8, 2, 2
        self.w13_input_scale = torch.nn.Parameter(torch.arange(16.0).reshape(8, 2) + 1, requires_grad=False)
        self.w2_input_scale = torch.nn.Parameter(torch.arange(8.0) + 1, requires_grad=False)
        self.w13_weight = torch.zeros(2, 64, 16, dtype=torch.uint8)
        self.w13_weight_scale = torch.zeros(2, 64, 2)
        self.w2_weight_scale = torch.zeros(2, 32, 2)
        self.w13_blockscale_swizzled = self.w2_blockscale_swizzled = None


def _process(monkeypatch, value: str | None):
    from sglang_glm5.patches import nvfp4_moe

    if value is not None:
        monkeypatch.setenv(nvfp4_moe.MOE_PATH_ENV, value)
    calls = []
    layer = _Layer()
    nvfp4_moe.process_weights_hook(lambda method, lay: calls.append(lay), _Method(), layer)
    return layer, calls


@pytest.mark.parametrize("value, want", [(None, "auto"), ("w4a16", "w4a16"), (" AUTO ", "auto")])
def test_switch_is_read_at_weight_processing(monkeypatch, value, want):
    from sglang_glm5.patches import nvfp4_moe

    layer, calls = _process(monkeypatch, value)
    assert calls == [layer] and getattr(layer, nvfp4_moe.MOE_PATH_ATTR) == want


@pytest.mark.parametrize(
    "env, value, error, match",
    [
        ("SGLANG_GLM5_MOE_PATH", "w4a8", ValueError, r"SGLANG_GLM5_MOE_PATH: expected one of auto, w4a16, w4a4"),
        ("SGLANG_GLM5_MOE_PATH", "w4a4", RuntimeError, r"SM12x.*got cpu"),  # forced W4A4 on a CPU layer
        ("SGLANG_GLM5_W4A4_MIN_TOKENS", "soon", ValueError, r"SGLANG_GLM5_W4A4_MIN_TOKENS"),
    ],
)
def test_bad_switch_stops_weight_processing_before_any_change(monkeypatch, env, value, error, match):
    from sglang_glm5.patches import nvfp4_moe

    monkeypatch.setenv(env, value)
    calls = []
    layer = _Layer()
    with pytest.raises(error, match=match):
        nvfp4_moe.process_weights_hook(lambda method, lay: calls.append(lay), _Method(), layer)
    assert calls == [] and not hasattr(layer, nvfp4_moe.MOE_PATH_ATTR)


def test_apply_passes_path_and_this_ranks_input_scales(monkeypatch):
    pytest.importorskip("sglang.srt.layers.moe.token_dispatcher.standard", reason="SGLang's modules are not installed")
    from types import SimpleNamespace

    from sglang_glm5 import moe
    from sglang_glm5.patches import nvfp4_moe

    layer, _ = _process(monkeypatch, "w4a16")
    for name in ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
                 "w2_weight_scale_2"):  # fmt: skip
        setattr(layer, name, torch.zeros(1))
    seen = {}

    def fake_op(*args, **kwargs):
        seen.update(kwargs)
        return torch.zeros(3, 4)

    monkeypatch.setattr(moe, "nvfp4_fused_moe", fake_op)
    topk = SimpleNamespace(topk_weights=torch.ones(3, 2), topk_ids=torch.zeros(3, 2, dtype=torch.int32))
    nvfp4_moe.apply_hook(None, _Method(), layer, SimpleNamespace(hidden_states=torch.zeros(3, 4), topk_output=topk))
    assert seen["path"] == "w4a16" and seen["w13_order"] == "gate_up"
    # Experts 4 and 5 of the global [8, 2] / [8] input scales: this rank's slices, not the global parameters.
    assert torch.equal(seen["w13_input_scale"], torch.tensor([[9.0, 10.0], [11.0, 12.0]]))
    assert torch.equal(seen["w2_input_scale"], torch.tensor([5.0, 6.0]))
