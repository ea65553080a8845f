"""The first command (`quickstart`), `doctor` on a machine without a GPU or SGLang, and what `tune` says offline.

The real quickstart (the op through the interpreter, the tiles compiled for sm_120) is measured from a fresh clone
(README); here its parts are stubbed where they take minutes, and the parts that decide are real: the target, the
tiles listed from the cache, the plan, the choice to tune, the last line, the exit status.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random
import re

import pytest
import torch

from sglang_glm5 import autotune, doctor, hardware, quickstart, tuner, variants
from sglang_glm5.cli import main
from sglang_glm5.patches import guard


@pytest.fixture
def no_gpu(monkeypatch):
    """This process as a machine without a GPU or NVIDIA driver (whatever runs the tests)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(doctor, "nvidia_driver_present", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # quickstart sets it without a GPU; restored after the test


@pytest.fixture
def stub_op_and_tiles(monkeypatch):
    """The op's run and the tiles' compiles replaced by records of their calls; (calls, set the op's exit status)."""
    calls = {"op": [], "tiles": [], "tune": []}
    status = {"op": 0}

    def op(gpu: bool) -> int:
        calls["op"].append(gpu)
        return status["op"]

    def tiles(target, items):
        calls["tiles"].append((target.name, len(items)))
        return doctor.OK, f"tiles: {len(items)} fit {target.name}"

    monkeypatch.setattr(quickstart, "_op", op)
    monkeypatch.setattr(doctor, "check_target_tiles", tiles)
    return calls, status


def test_quickstart_without_a_gpu_ends_with_what_passed_and_the_next_step(no_gpu, stub_op_and_tiles, capsys):
    calls, _ = stub_op_and_tiles
    assert main(["quickstart"]) == 0
    out = capsys.readouterr().out
    target = hardware.TARGETS[quickstart.DEFAULT_TARGET]
    shipped = len(doctor.target_tiles(target))
    assert calls["op"] == [False] and calls["tiles"] == [(target.name, shipped)] and shipped > 0
    assert "under rtx-pro-6000x8-ep8" in out and "requests of 32,768 tokens" in out  # the plan, in a few lines
    last = out.strip().splitlines()[-1]
    assert last.startswith("quickstart: passed in ") and "through the interpreter" in last, last
    assert f"{shipped} rtx-pro-6000 tiles within 101376 B" in last and "plan fits" in last, last
    assert "next, on the GPU box:" in last and "sglang-glm5 quickstart" in last, last


def test_quickstart_says_what_failed(no_gpu, stub_op_and_tiles, capsys):
    _, status = stub_op_and_tiles
    status["op"] = 1
    assert main(["quickstart"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("quickstart: FAILED: the op against float64") and "next" not in last, last


@pytest.mark.parametrize(
    "gpu, tunes, profile",
    [
        ("rtx-pro-6000", True, "rtx-pro-6000x8-ep8"),  # the shipped sm_120 entries are unmeasured: tune it
        ("h100", False, "rtx-pro-6000x8-ep8"),  # reads the H200's measured entries (same SMs); no H100 profile ships
        ("h200", False, "h200x8"),
    ],
)
def test_quickstart_on_a_gpu_tunes_it_when_no_entry_was_measured_there(
    monkeypatch, capsys, stub_op_and_tiles, gpu, tunes, profile
):
    calls, _ = stub_op_and_tiles
    target = hardware.TARGETS[gpu]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: target.device_name)
    monkeypatch.setattr(hardware, "detect", lambda *a: target)
    import sglang_glm5.cli as cli

    monkeypatch.setattr(cli, "_cmd_tune", lambda args: calls["tune"].append(args.target) or 0)
    assert main(["quickstart"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert calls["op"] == [True] and calls["tiles"][0][0] == gpu
    assert calls["tune"] == (["local"] if tunes else []), calls
    assert ("tuned and measured" in last) == tunes and ("measured cache entries" in last) == (not tunes), last
    assert "next: `sglang-glm5 doctor`" in last, last
    assert f"the {profile} plan fits" in last, last  # the shipped profile for this GPU, else the default
    assert main(["quickstart", "--no-tune"]) == 0 and len(calls["tune"]) == tunes  # --no-tune: not again


def test_the_tiles_check_names_a_tile_over_the_shared_memory_or_refused(monkeypatch):
    target = hardware.TARGETS["rtx-pro-6000"]
    tiles = doctor.target_tiles(target)
    rng = random.Random()
    fits = [rng.randint(1, target.shared_per_block) for _ in tiles]
    from sglang_glm5.variants import w4a16_tiles

    monkeypatch.setattr(w4a16_tiles, "compiled_shared_bytes_many", lambda items, t: list(fits))
    status, line = doctor.check_target_tiles(target, tiles)
    assert status == doctor.OK and f"the {len(tiles)} W4A16 tiles" in line and f"largest {max(fits)} B" in line
    i = rng.randrange(len(tiles))
    fits[i] = target.shared_per_block + rng.randint(1, 4096)
    status, line = doctor.check_target_tiles(target, tiles)
    assert status == doctor.FAIL and f"{tiles[i][1].label} ({fits[i]} B)" in line, line
    fits[i] = variants.DECODE_REFUSED + " x"
    status, line = doctor.check_target_tiles(target, tiles)
    assert status == doctor.FAIL and "would refuse 1 of" in line and tiles[i][1].label in line, line


# ---------------------------------------------------------------------------------------------------------------
# doctor


def test_doctor_passes_without_a_gpu_or_sglang_and_names_the_extra(no_gpu, monkeypatch, tmp_path, capsys, caplog):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / "rtx-pro-6000.json").write_text("")  # an empty cache file
    (tmp_path / "aot_shared.json").write_text('{"sm_120|gemm1": ' + str(random.Random().randint(1, 99)))  # cut off
    monkeypatch.setattr(guard, "installed_sglang_version", lambda: None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "locust" else real(name, *a))
    autotune.clear_reports()
    assert main(["doctor"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "[warn] sglang: not installed" in out and 'pip install "sglang-glm5[sglang]"' in out, out
    assert 'pip install ".[sglang]"' in out and "[warn] extra loadtest: locust not installed" in out, out
    assert "[skip] plugin: SGLang hook targets not checked" in out
    assert re.search(r"\[warn\] cache: \S*aot_shared.json cannot be read", out), out
    assert out.count("rtx-pro-6000.json") + captured.err.count("rtx-pro-6000.json") == 1, out  # once, not twice
    assert "rtx-pro-6000.json" not in caplog.text
    assert "[FAIL]" not in out and out.strip().splitlines()[-1].startswith("doctor: all checks passed (")
    assert "skipped: GPU, plugin, tiles, op)" in out.strip().splitlines()[-1]


def test_doctor_fails_where_a_driver_is_there_but_torch_sees_no_gpu(no_gpu, monkeypatch):
    monkeypatch.setattr(doctor, "nvidia_driver_present", lambda: True)
    status, line = doctor.check_gpu(no_gpu=False)
    assert status == doctor.FAIL and "NVIDIA driver but torch" in line, line


# ---------------------------------------------------------------------------------------------------------------
# tune offline: one line before any work when the cache folder is unusable; says when its picks are the shipped ones


@pytest.mark.parametrize("command", ["tune", "stock-configs"])  # both write to the cache folder by default
@pytest.mark.parametrize("where", ["a file", "below a file", "/proc"])
def test_an_unusable_cache_folder_is_one_line_before_any_work(monkeypatch, tmp_path, capsys, where, command):
    from sglang_glm5 import stock_configs

    afile = tmp_path / "afile"
    afile.write_text("x")
    folder = {"a file": afile, "below a file": afile / "sub", "/proc": "/proc/sglang-glm5-nope"}[where]
    if where == "/proc" and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(folder))
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("tune started work"))
    monkeypatch.setattr(stock_configs, "generate", lambda out: pytest.fail("stock-configs started work"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # SGLang "installed"
    assert main([command]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"SGLANG_GLM5_CACHE_DIR={folder}" in err and "--out" not in err, err


def test_tune_offline_says_when_its_picks_are_the_shipped_ones(monkeypatch, tmp_path, capsys):
    target = hardware.TARGETS["rtx-pro-6000"]
    shipped = autotune.ConfigCache(target, paths=[autotune.shipped_cache_path(target)]).entries
    picks = dict(shipped)
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: (picks, tuner.TuneReport()))
    out = tmp_path / "picks.json"
    assert main(["tune", "--out", str(out), "--no-survey"]) == 0
    assert f"the {len(picks)} picks equal the shipped ones (rtx-pro-6000.json)" in capsys.readouterr().out
    key = random.Random().choice(sorted(picks))
    changed = dict(block_m=picks[key].config.block_m * 2)
    picks[key] = dataclasses.replace(picks[key], config=dataclasses.replace(picks[key].config, **changed))
    assert main(["tune", "--out", str(out), "--no-survey"]) == 0
    assert f"1 of {len(picks)} picks differ from the shipped ones" in capsys.readouterr().out
