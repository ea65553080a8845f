"""Wiring of the W4A4 path: resolve_path, the measured threshold that gates "auto" (stored only by a
`tune --path w4a4` whose check against float64 passed), `tune --path w4a4` offline and with a faked GPU,
the self-check, and the SGLang switch SGLANG_GLM5_MOE_PATH.

No SM12x GPU here: the device is faked where a rule depends on it (torch.cuda's capability, name and
hardware.detect), and the self-check runs on the CPU with the W4A4 kernels through the interpreter
(dot_scaled swapped for a decoded dot) or with a deliberately broken op.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from sglang_glm5 import autotune, hardware, tuner, variants, w4a4, w4a4_select, w4a4_tune, w4a4_verify
from sglang_glm5.cli import main
from sglang_glm5.hardware import TARGETS
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a4 as family
from sglang_glm5.w4a4_select import resolve_path
from sglang_glm5.w4a4_verify import run_selfcheck

SM120 = TARGETS["rtx-pro-6000"]
SHAPE = MoeShape(num_experts=8, hidden=256, inter=128, top_k=4)
OTHER = MoeShape(num_experts=8, hidden=256, inter=256, top_k=4)
CUDA = torch.device("cuda", 0)
SCALES = {"has_input_scales": True}
MIN_TOKENS_ENV = "SGLANG_GLM5_W4A4_MIN_TOKENS"
W4A4 = variants.get("w4a4")


def _key(kernel, bucket, shape=SHAPE, *, measured=True, variant=W4A4) -> str:
    """A W4A4 tile's cache key."""
    return autotune.cache_key(SM120, kernel, autotune.gemm_shape(kernel, shape), bucket, measured=measured,
                              variant=variant)  # fmt: skip


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    for env in (MIN_TOKENS_ENV, "SGLANG_GLM5_MOE_PATH"):
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


CHECKED = tuple(2**n for n in range(13))  # every bucket, 1 .. 4096 tokens per expert


def _tuned(threshold: float | None, shape=SHAPE, checked=CHECKED) -> None:
    """What a passing `tune --path w4a4` on this GPU leaves in the user cache: the measured threshold and
    the buckets whose tiles it checked."""
    w4a4.store_threshold(autotune.user_cache_path(SM120), SM120, shape, threshold, {64: (1.0, 0.8)}, checked=checked)
    w4a4_select.clear_memo()


# ---------------------------------------------------------------------------------------------
# resolve_path


def test_invalid_path_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"'auto', 'w4a16', 'w4a4', got 'w4a8'"):
        resolve_path("w4a8", torch.device("cpu"), 100, SHAPE, has_input_scales=True)


@pytest.mark.parametrize("device", ["cpu", "sm90", "sm120"])
def test_w4a16_is_always_allowed(device, fake_gpu):
    if device != "cpu":
        fake_gpu(SM120 if device == "sm120" else TARGETS["h200"])
    dev = torch.device("cpu") if device == "cpu" else CUDA
    assert resolve_path("w4a16", dev, 1e6, SHAPE, has_input_scales=False) == "w4a16"


def test_w4a4_refused_off_sm12x(fake_gpu):
    with pytest.raises(RuntimeError, match="SM12x.*got cpu"):
        resolve_path("w4a4", torch.device("cpu"), 1e6, SHAPE, **SCALES)
    fake_gpu(TARGETS["h200"])
    with pytest.raises(RuntimeError, match="SM12x.*got sm_90"):
        resolve_path("w4a4", CUDA, 1e6, SHAPE, **SCALES)


def test_w4a4_forced_needs_the_input_scales_but_no_tune(fake_gpu):
    fake_gpu()
    with pytest.raises(RuntimeError, match="input scales"):
        resolve_path("w4a4", CUDA, 1e6, SHAPE, has_input_scales=False)
    assert resolve_path("w4a4", CUDA, 1, SHAPE, **SCALES) == "w4a4"  # forced: no threshold needed


def test_auto_takes_w4a4_only_after_a_passing_tune_from_its_threshold(fake_gpu):
    fake_gpu()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"  # SM120, prefill size, but never tuned here
    _tuned(64)
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 63.9, SHAPE, **SCALES) == "w4a16"  # below the measured threshold
    assert resolve_path("auto", CUDA, 1e6, OTHER, **SCALES) == "w4a16"  # another layer shape: not tuned
    assert resolve_path("auto", CUDA, 1e6, SHAPE, has_input_scales=False) == "w4a16"


def test_only_a_layer_that_may_take_w4a4_keeps_the_checkpoint_layout(fake_gpu):
    """The W4A4 kernels read the checkpoint's codes and scales; every other layer gets the W4A16 kernel layout."""
    may = w4a4_select.may_take_w4a4
    fake_gpu()
    assert may("w4a4", CUDA, SHAPE, **SCALES)  # forced
    assert not may("w4a16", CUDA, SHAPE, **SCALES)
    assert not may("auto", CUDA, SHAPE, **SCALES)  # SM120, never tuned for W4A4 here
    _tuned(64)
    assert may("auto", CUDA, SHAPE, **SCALES)
    assert not may("auto", CUDA, OTHER, **SCALES) and not may("auto", CUDA, SHAPE, has_input_scales=False)
    _tuned(None)  # the tune found W4A4 never faster
    assert not may("auto", CUDA, SHAPE, **SCALES)
    fake_gpu(TARGETS["h200"])
    w4a4_select.clear_memo()
    assert not may("auto", CUDA, SHAPE, **SCALES)


def test_auto_stays_on_w4a16_for_weights_in_the_kernel_layout(fake_gpu, monkeypatch, gen):
    """A layer loaded in the kernel layout, then W4A4 tuned while it serves: auto must not hand its
    re-encoded codes to the W4A4 kernels; a forced w4a4 gets the W4A4 path's clear error."""
    from sglang_glm5 import moe
    from sglang_glm5.testing import random_layer, random_routing
    from sglang_glm5.variants import w4a16
    from sglang_glm5.weights import Nvfp4MoeWeights

    layer = random_layer(SHAPE.num_experts, SHAPE.hidden, SHAPE.inter, gen)
    bundle = Nvfp4MoeWeights.build(*layer.args(), w13_input_scale=1.0, w2_input_scale=1.0).converted("kernel")
    x = torch.randn(64, SHAPE.hidden, generator=gen).bfloat16()
    weights, ids = random_routing(64, SHAPE.num_experts, 4, gen)
    monkeypatch.setattr(w4a4_select, "resolve_path", lambda path, *a, **k: "w4a4")  # as if tuned and above it
    taken = []
    monkeypatch.setattr(w4a16, "run", lambda *a, out, **k: taken.append("w4a16") or out)
    moe.fused_moe(x, bundle, weights, ids, path="auto")
    assert taken == ["w4a16"]
    with pytest.raises(RuntimeError, match="checkpoint's codes and block scales"):
        moe.fused_moe(x, bundle, weights, ids, path="w4a4")


def test_auto_never_w4a4_off_sm12x_even_with_a_threshold(fake_gpu):
    fake_gpu(TARGETS["h200"])
    w4a4.store_threshold(
        autotune.user_cache_path(TARGETS["h200"]), TARGETS["h200"], SHAPE, 1, {1: (1.0, 0.5)}, checked=CHECKED
    )
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"


def test_a_threshold_of_another_gpu_or_kernel_revision_does_not_count(fake_gpu):
    fake_gpu()
    server = TARGETS["rtx-pro-6000-server"]
    w4a4.store_threshold(autotune.user_cache_path(server), server, SHAPE, 1, {1: (1.0, 0.5)}, checked=CHECKED)
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"  # measured on another kind of GPU
    _tuned(1)
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a4"
    path = autotune.user_cache_path(SM120)  # the same threshold, stored under the W4A4 kernels' revision before
    data = json.loads(path.read_text())
    now = f"|w4a4.r{family.KERNEL_REVISION}|"
    data["w4a4_threshold"] = {k.replace(now, f"|w4a4.r{family.KERNEL_REVISION - 1}|"): v
                              for k, v in data["w4a4_threshold"].items()}  # fmt: skip
    path.write_text(json.dumps(data))
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"


def test_thresholds_are_memoized_until_cleared(fake_gpu):
    fake_gpu()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    path = autotune.user_cache_path(SM120)
    w4a4.store_threshold(path, SM120, SHAPE, 1, {1: (1.0, 0.5)}, checked=CHECKED)  # behind its back
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a4"


def test_auto_runs_w4a4_only_at_the_buckets_the_tune_checked(fake_gpu, monkeypatch):
    fake_gpu()
    _tuned(64, checked=[64, 128])  # a tune over --batch-sizes 64,128
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 100, SHAPE, **SCALES) == "w4a4"  # bucket 128
    assert resolve_path("auto", CUDA, 200, SHAPE, **SCALES) == "w4a16"  # bucket 256: no check ran its tiles
    monkeypatch.setenv(MIN_TOKENS_ENV, "16")  # the switch moves the threshold, not the checked buckets
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 16, SHAPE, **SCALES) == "w4a16"


def test_never_faster_means_never_whatever_the_switch_says(fake_gpu, monkeypatch):
    fake_gpu()
    _tuned(None, checked=[])  # stored without a check: W4A4 lost at every bucket
    monkeypatch.setenv(MIN_TOKENS_ENV, "1")
    w4a4_select.clear_memo()
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"


def test_a_broken_cache_file_means_untuned_not_an_error(fake_gpu, caplog):
    fake_gpu()
    path = autotune.user_cache_path(SM120)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
    assert "not valid JSON" in caplog.text


# ---------------------------------------------------------------------------------------------
# The threshold: measured by a passing tune; the env replaces the number, not the need for the tune.


def test_threshold_env_override(fake_gpu, monkeypatch):
    fake_gpu()
    monkeypatch.setenv(MIN_TOKENS_ENV, "8")
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"  # no passing tune: still W4A16
    _tuned(256)
    assert resolve_path("auto", CUDA, 8, SHAPE, **SCALES) == "w4a4"
    assert resolve_path("auto", CUDA, 7.9, SHAPE, **SCALES) == "w4a16"


@pytest.mark.parametrize("value", ["lots", "-4", "inf", "nan"])
def test_threshold_env_rejects_non_numbers(fake_gpu, monkeypatch, value):
    fake_gpu()
    _tuned(64)
    monkeypatch.setenv(MIN_TOKENS_ENV, value)
    with pytest.raises(ValueError, match=f"SGLANG_GLM5_W4A4_MIN_TOKENS: expected .* got '{value}'"):
        resolve_path("auto", CUDA, 100, SHAPE, **SCALES)


def test_tuner_found_w4a4_never_faster(fake_gpu):
    fake_gpu()
    _tuned(None)
    assert resolve_path("auto", CUDA, 1e12, SHAPE, **SCALES) == "w4a16"
    assert resolve_path("w4a4", CUDA, 1, SHAPE, **SCALES) == "w4a4"  # forcing still works


def test_malformed_threshold_is_reported_and_auto_stays_on_w4a16(fake_gpu, caplog):
    fake_gpu()
    path = autotune.user_cache_path(SM120)
    path.parent.mkdir(parents=True)
    key = w4a4.threshold_key(SM120, SHAPE)
    path.write_text(json.dumps({w4a4.THRESHOLD_KEY: {key: {"min_tokens_per_expert": "many"}}}))
    assert resolve_path("auto", CUDA, 1e6, SHAPE, **SCALES) == "w4a16"
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
    return w4a4.nvfp4_fused_moe_w4a4(*args, w13_order="gate_up", config=None, emulate_dot=True)


def _selfcheck(w4a4_op, gen, tokens=(16, 40)) -> w4a4_verify.SelfCheckResult:
    lines = []
    result = run_selfcheck(SHAPE, tokens, torch.device("cpu"), gen, w4a4_op=w4a4_op, say=lines.append)
    print("\n".join(lines))
    assert len(lines) == 1 + len(tokens)  # the header and one row per token count
    return result


def test_selfcheck_passes_the_interpreted_kernels_and_records_nothing(gen, isolated):
    result = _selfcheck(_interpreter_w4a4, gen)
    assert result.passed, [r.problems for r in result.rows]
    for row in result.rows:
        assert row.w4a4_rms <= row.bound and row.vs_emulation < w4a4_verify.EMULATION_RMS and row.w4a16_rel < 1e-2
    assert list(isolated.iterdir()) == []  # the gate is the tuner's threshold, never a check's side effect


@pytest.mark.parametrize(
    "broken, problem",
    [
        (lambda *a: _interpreter_w4a4(*a) * 1.25, "rms"),  # a scale off by 25%: beyond the bound
        (lambda *a: w4a4.nvfp4_fused_moe_w4a4_emulated(*a) * 1.03, "vs emulation"),  # within the bound, not the math
        (lambda *a: torch.full_like(a[0], float("nan")), "non-finite"),
    ],
    ids=["scaled", "slightly-off", "nan"],
)
def test_selfcheck_fails_a_wrong_op(gen, broken, problem):
    result = _selfcheck(broken, gen, tokens=(24,))
    assert not result.passed
    assert any(problem in p for p in result.rows[0].problems), result.rows[0].problems


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


# ---------------------------------------------------------------------------------------------
# tune --path w4a4


def _fake_gpu_tune(monkeypatch, check_fails: bool, checked: list) -> int:
    """`tune --path w4a4 --target local` with its GPU parts faked: tiles timed (the tallest block_m wins),
    both ops timed (W4A4 faster from m=64), then the check against float64 of every tuned bucket's tiles."""
    monkeypatch.setattr(w4a4_tune, "kernel_bencher", lambda shape, seed: lambda kernel, cfg, bucket: 1 / cfg.block_m)
    monkeypatch.setattr(w4a4_tune, "op_bencher", lambda shape, seed: lambda m, cfg: (1.0, 2.0 if m < 64 else 0.5))
    monkeypatch.setattr(w4a4_tune, "check_tiles",
                        lambda shape, picked, buckets, seed: checked.append(buckets) or check_fails)  # fmt: skip
    argv = ["tune", "--path", "w4a4", "--target", "local", "--shape", "8,256,128", "--batch-sizes", "16,64,256"]
    rc = main(argv)
    w4a4_select.clear_memo()
    return rc


@pytest.mark.parametrize("check_fails", [False, True])
def test_tune_on_the_gpu_stores_the_threshold_only_after_the_check_passes(fake_gpu, monkeypatch, capsys,
                                                                           check_fails):  # fmt: skip
    fake_gpu()
    checked = []
    assert _fake_gpu_tune(monkeypatch, check_fails, checked) == (1 if check_fails else 0)
    assert checked == [[16, 64, 256]]  # every tuned bucket's tiles
    want = "w4a16" if check_fails else "w4a4"
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == want
    assert resolve_path("auto", CUDA, 16, SHAPE, **SCALES) == "w4a16"  # below the measured threshold
    assert ("FAILED its check" in capsys.readouterr().out) == check_fails


def test_a_failing_retune_takes_back_the_earlier_threshold(fake_gpu, monkeypatch):
    """The second tune stored new tiles and failed: auto must not run them on the first tune's threshold."""
    fake_gpu()
    assert _fake_gpu_tune(monkeypatch, False, []) == 0
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a4"
    assert _fake_gpu_tune(monkeypatch, True, []) == 1
    assert resolve_path("auto", CUDA, 64, SHAPE, **SCALES) == "w4a16"
    stored = json.loads(autotune.user_cache_path(SM120).read_text())
    assert w4a4.threshold_key(SM120, SHAPE) not in stored.get(w4a4.THRESHOLD_KEY, {})


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
    keys = {_key(k, b, shape, measured=False): (k, b) for k in ("gemm1", "gemm2") for b in (64, 512)}
    assert set(data["entries"]) == set(keys)  # only W4A4 keys: the W4A16 entries are another command's
    for key, entry in data["entries"].items():
        kernel, bucket = keys[key]
        cfg = GemmConfig(**entry["config"])
        assert entry["measured"] is False and entry["ms"] is None
        assert cfg == getattr(family.heuristic_config(bucket), kernel)  # the heuristic fits sm_120
        (compiled,) = family.compiled_shared_bytes_many([(kernel, cfg)], 120)
        assert entry["shared_bytes"] == compiled and SM120.fits(compiled)
    assert w4a4.THRESHOLD_KEY not in data  # offline: no threshold, so path='auto' stays on W4A16
    out = capsys.readouterr().out
    assert "not measured" in out and "no threshold" in out
    # The op's config lookup reads these entries back.
    cache = autotune.ConfigCache(SM120)
    assert cache.lookup(shape, 300, "w4a4") == family.heuristic_config(300)


def test_w4a4_keys_survive_a_new_w4a16_kernel_revision():
    before = _key("gemm1", 64)
    w16 = variants.get("w4a16")
    w16_before = autotune.cache_key(SM120, "gemm1", (8, 256, 256), 64, measured=True, variant=w16)
    newer = dataclasses.replace(w16, revision=w16.revision + 1)
    assert autotune.cache_key(SM120, "gemm1", (8, 256, 256), 64, measured=True, variant=newer) != w16_before
    assert _key("gemm1", 64) == before  # W4A4 tiles stay
    newer4 = dataclasses.replace(W4A4, revision=W4A4.revision + 1)
    assert _key("gemm1", 64, variant=newer4) != before  # their own revision retires them


@pytest.mark.parametrize("target", ["local", "h200"])
def test_tune_w4a4_refuses_non_sm12x_in_one_line(target, capsys):
    assert main(["tune", "--path", "w4a4", "--target", target]) == 2
    err = capsys.readouterr().err.strip()
    want = "torch sees no CUDA GPU" if target == "local" else "needs an SM12x GPU (RTX PRO 6000, RTX 50xx), got h200"
    assert "\n" not in err and want in err, err


def test_tuner_never_benchmarks_a_w4a4_config_that_overflows(monkeypatch):
    space = [
        GemmConfig(64, 64, 128, 4, 3),
        GemmConfig(128, 128, 128, 8, 3),
        GemmConfig(128, 128, 256, 8, 4),  # 149504 B in gemm1 on sm_120: over 101376
    ]
    variant = dataclasses.replace(W4A4, search_space=lambda bucket: space)
    benched = []

    def fake_bench(kernel, cfg, bucket):
        (shared,) = family.compiled_shared_bytes_many([(kernel, cfg)], 120)
        assert SM120.fits(shared), f"benchmarked {kernel} {cfg.label}: {shared} B"
        benched.append((kernel, cfg))
        return 1.0 / cfg.block_m  # the tallest feasible tile wins

    entries, report = tuner.tune(SM120, SHAPE, [256], fake_bench, variant=variant)
    assert report.candidates == 6 and report.pruned_by_model >= 1 and report.benchmarked == len(benched)
    assert ("gemm1", space[2]) not in benched
    assert entries[_key("gemm1", 256)].config == space[1]
    assert entries[_key("gemm1", 256)].ms == pytest.approx(1 / 128)
    with pytest.raises(ValueError, match="W4A4 runs only on an SM12x GPU.*h200"):
        tuner.tune(TARGETS["h200"], SHAPE, [256], fake_bench, variant=variant)


def test_a_w4a4_candidate_that_fails_on_the_gpu_is_skipped(monkeypatch):
    """Never run on SM120: a candidate whose compile or launch fails there must not end the tune."""
    space = [GemmConfig(64, 64, 128, 4, 3), GemmConfig(128, 64, 128, 4, 3)]
    variant = dataclasses.replace(W4A4, search_space=lambda bucket: space)

    def flaky_bench(kernel, cfg, bucket):
        if cfg.block_m == 128:
            raise RuntimeError("PassManager::run failed")
        return 1.0

    entries, report = tuner.tune(SM120, SHAPE, [256], flaky_bench, variant=variant)
    assert report.benchmarked == 2 and report.pruned_by_compiler == 2
    assert all(e.config == space[0] for e in entries.values())

    def broken_bench(kernel, cfg, bucket):
        raise RuntimeError("PassManager::run failed")

    with pytest.raises(RuntimeError, match="no W4A4 config of gemm1 ran on this GPU.*PassManager"):
        tuner.tune(SM120, SHAPE, [256], broken_bench, variant=variant)


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
        # E = 2 local experts, H = 32, I = 32; values do not matter here
        self.w13_weight = torch.zeros(2, 64, 16, dtype=torch.uint8)
        self.w13_weight_scale = torch.zeros(2, 64, 2, dtype=torch.float8_e4m3fn)
        self.w13_weight_scale_2 = torch.ones(2, 2)
        self.w2_weight = torch.zeros(2, 32, 16, dtype=torch.uint8)
        self.w2_weight_scale = torch.zeros(2, 32, 2, dtype=torch.float8_e4m3fn)
        self.w2_weight_scale_2 = torch.ones(2)
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


def test_apply_passes_path_and_the_bundle_with_this_ranks_input_scales(monkeypatch):
    pytest.importorskip("sglang.srt.layers.moe.token_dispatcher.standard", reason="SGLang's modules are not installed")
    from types import SimpleNamespace

    from sglang_glm5 import moe
    from sglang_glm5.patches import nvfp4_moe

    layer, _ = _process(monkeypatch, "w4a16")
    seen = {}

    def fake_op(x, weights, topk_weights, topk_ids, **kwargs):
        seen.update(kwargs, weights=weights)
        return torch.zeros(3, 4)

    monkeypatch.setattr(moe, "fused_moe", fake_op)
    topk = SimpleNamespace(topk_weights=torch.ones(3, 2), topk_ids=torch.zeros(3, 2, dtype=torch.int32))
    nvfp4_moe.apply_hook(None, _Method(), layer, SimpleNamespace(hidden_states=torch.zeros(3, 4), topk_output=topk))
    bundle = seen["weights"]
    assert (
        seen["path"] == "w4a16" and bundle.w13_order == "gate_up" and bundle is getattr(layer, nvfp4_moe.WEIGHTS_ATTR)
    )
    # Experts 4 and 5 of the global [8, 2] / [8] input scales: this rank's slices, not the global parameters.
    assert torch.equal(bundle.a1, torch.tensor([12.0])) and torch.equal(bundle.a2, torch.tensor([5.0, 6.0]))


def test_the_plugin_reencodes_in_place_and_restores_before_a_weight_update(monkeypatch, gen):
    """On a GPU (faked: hardware.device_arch) process_weights_after_loading re-encodes the layer's own tensors;
    SGLang's restore_weights_before_loading (hooked) puts the checkpoint's bytes back before an update, so a
    partial reload followed by the post-processing again leaves every tensor right."""
    from sglang_glm5.patches import nvfp4_moe
    from sglang_glm5.testing import random_layer

    monkeypatch.setattr(hardware, "device_arch", lambda device=None: 90)
    names = tuple(f"{w}_weight{s}" for w in ("w13", "w2") for s in ("", "_scale", "_scale_2"))
    checkpoint = random_layer(2, 32, 32, gen).args()  # the _Layer's shapes: E = 2, H = I = 32
    layer = _Layer()
    for name, t in zip(names, checkpoint, strict=True):
        setattr(layer, name, t.clone())

    def same_bytes(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype != torch.float32 else torch.equal(a, b)

    def process():
        nvfp4_moe.process_weights_hook(lambda method, lay: None, _Method(), layer)
        return getattr(layer, nvfp4_moe.WEIGHTS_ATTR)

    bundle = process()
    assert bundle.layout == "kernel" and bundle.w13 is layer.w13_weight  # in place: the layer's own tensors
    assert not same_bytes(layer.w13_weight, checkpoint[0])
    nvfp4_moe.restore_hook(lambda method, lay: None, _Method(), layer)
    assert all(same_bytes(getattr(layer, n), t) for n, t in zip(names, checkpoint, strict=True))
    assert getattr(layer, nvfp4_moe.WEIGHTS_ATTR).layout == "checkpoint"
    layer.w2_weight.copy_(checkpoint[3])  # an update that rewrites w2 alone
    again = process().converted("checkpoint")
    assert all(same_bytes(t, c) for t, c in zip(again.args(), checkpoint, strict=True))
