"""``sglang-glm5 doctor`` on a machine without a GPU: one line per check, exit status from the failures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_glm5 import cli
from sglang_glm5.patches import guard


def test_doctor_imports_nothing_heavy():
    code = "import sys, sglang_glm5.doctor; print(sorted({'torch', 'triton', 'sglang'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_doctor_passes_here(capsys):
    pytest.importorskip("sglang.srt.plugins", reason="SGLang's modules are not installed")
    rc = cli.main(["doctor", "--no-gpu"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert rc == 0, out
    assert any(f"sglang {guard.SUPPORTED_SGLANG_VERSIONS[0]}" in line and line.startswith("[  ok]") for line in lines)
    assert any("entry point sglang_glm5 -> sglang_glm5.patches:plugin" in line for line in lines)
    assert any("hooked SGLang symbol" in line and line.startswith("[  ok]") for line in lines)
    assert out.rstrip().splitlines()[-1].startswith("doctor: all checks passed")


def test_doctor_fails_on_another_sglang_version(capsys, monkeypatch):
    monkeypatch.setattr(guard, "installed_sglang_version", lambda: "0.5.99")
    rc = cli.main(["doctor", "--no-gpu"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[FAIL] sglang 0.5.99 (supported: 0.5.23)" in out and "1 check(s) FAILED" in out


def test_doctor_counts_an_h100s_entries_borrowed_from_the_h200(monkeypatch, tmp_path):
    # On a GPU, doctor counts what the op's lookup reads: an H100 SXM has no entries of its own and reads the shipped
    # h200.json's measured ones as a sibling's (autotune.siblings).
    import json

    import torch

    from sglang_glm5 import autotune, doctor, hardware

    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "detect", lambda device=0: hardware.TARGETS["h100"])
    shipped = json.loads((autotune.shipped_dir() / "h200.json").read_text())["entries"]
    level, text = doctor.check_cache()[0]
    assert level == doctor.OK, text
    assert f"cache: {len(shipped)} entries for h100 (0 measured on it, {len(shipped)} measured on h200" in text
    assert "0 unmeasured" in text


def test_doctor_reports_the_tiles_the_op_would_refuse_before_serving(monkeypatch, tmp_path, capsys):
    # On a GPU (faked: an H100 SXM, which reads the shipped h200 entries), the tiles its op may launch go through the
    # decode check; the compiles are stubbed here (tests/test_decode_pairs.py runs them for real): one refused tile
    # fails the check, naming it; none passes it.
    import torch

    from sglang_glm5 import doctor, hardware, variants
    from sglang_glm5.variants import w4a16_tiles

    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "detect", lambda device=0: hardware.TARGETS["h100"])
    seen = []

    def compiled(items, target, refuse=None):
        seen.append((items, target.arch))
        return [f"{w4a16_tiles.DECODE_REFUSED}pairs" if (k, c) == refuse else 1024 for k, c in items]

    monkeypatch.setattr(w4a16_tiles, "compiled_shared_bytes_many", compiled)
    level, text = doctor.check_tiles(no_gpu=False, skip=False)[0]
    (items, arch), heuristic_only = seen[0], w4a16_tiles.launchable_tiles([], variants.get("w4a16"))
    assert level == doctor.OK and f"the {len(items)} W4A16 tiles" in text and arch == 90, text
    assert len(items) > len(heuristic_only), "the shipped h200 entries are among the tiles checked"
    bad = items[0]
    monkeypatch.setattr(w4a16_tiles, "compiled_shared_bytes_many", lambda i, t: compiled(i, t, refuse=bad))
    level, text = doctor.check_tiles(no_gpu=False, skip=False)[0]
    assert level == doctor.FAIL and f"refuse 1 of {len(items)}" in text and f"{bad[0]} {bad[1].label}" in text, text
    assert doctor.check_tiles(no_gpu=True, skip=False)[0][0] == doctor.SKIP
    assert doctor.check_tiles(no_gpu=False, skip=True)[0][0] == doctor.SKIP
