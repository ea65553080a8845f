"""Load-test pieces that run in this process: SSE parsing, prompts, metrics, and `compare` on synthetic folders.

Nothing here imports Locust (it monkey-patches the standard library); the Locust runs are in
test_loadtest_e2e.py, in subprocesses.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_glm5.cli import main
from sglang_glm5.loadtest import metrics, report
from sglang_glm5.loadtest.sse import StreamError, StreamMeter
from sglang_glm5.loadtest.workload import PromptSource, Workload, request_for


def _chat(content: str | None = None, usage: dict | None = None, reasoning: str | None = None) -> bytes:
    delta = {k: v for k, v in (("content", content), ("reasoning_content", reasoning)) if v is not None}
    choices = [{"index": 0, "delta": delta, "finish_reason": None}] if usage is None else []
    return b"data: " + json.dumps({"choices": choices, "usage": usage}).encode() + b"\n"


def test_stream_meter_chat_times_and_usage():
    m = StreamMeter("chat", start=0.0)
    m.feed_line(_chat(""), 0.01)  # the role chunk carries no output: not the first token
    m.feed_line(b"\n", 0.01)
    m.feed_line(b": keep-alive\n", 0.02)
    for k, t in enumerate((0.10, 0.12, 0.15)):
        m.feed_line(_chat(f"t{k}"), t)
    m.feed_line(_chat(usage={"prompt_tokens": 9, "completion_tokens": 3}), 0.151)
    m.feed_line(b"data: [DONE]\n", 0.16)
    r = m.finish(0.16)
    assert r["ttft"] == pytest.approx(0.10)
    assert r["itl"] == pytest.approx([0.02, 0.03])
    assert r["tpot"] == pytest.approx((0.16 - 0.10) / 2)
    assert (r["output_tokens"], r["input_tokens"], r["tokens_from"]) == (3, 9, "usage")


def test_stream_meter_counts_chunks_without_usage_and_reasoning_content():
    m = StreamMeter("chat", start=0.0)
    m.feed_line(_chat(reasoning="thinking"), 0.1)  # GLM-5's reasoning parser: output all the same
    m.feed_line(_chat("answer"), 0.2)
    m.feed_line(b"data: [DONE]\n", 0.2)
    r = m.finish(0.2)
    assert (r["output_tokens"], r["tokens_from"], r["ttft"]) == (2, "counted", 0.1)


def test_stream_meter_native_generate_cumulative():
    m = StreamMeter("generate", start=0.0)
    for k, t in enumerate((0.05, 0.07, 0.09)):
        meta = {"prompt_tokens": 4, "completion_tokens": k + 1}
        m.feed_line(b"data: " + json.dumps({"text": "x" * (k + 1), "meta_info": meta}).encode() + b"\n", t)
    m.feed_line(b"data: [DONE]\n", 0.1)
    r = m.finish(0.1)
    assert (r["ttft"], r["output_tokens"], r["input_tokens"]) == (0.05, 3, 4)


@pytest.mark.parametrize(
    "lines, reason",
    [
        ([b"data: {not json\n"], "malformed chunk"),  # a chunk that is not JSON
        ([b'data: {"error": {"message": "oom"}}\n'], "server error in stream: oom"),  # SGLang's error chunk
        ([_chat("a")], "stream ended before [DONE] after 1 output chunks"),  # connection closed mid-stream
        ([b"data: [DONE]\n"], "stream finished without output"),  # [DONE] but nothing generated
    ],
)
def test_stream_meter_failures(lines, reason):
    m = StreamMeter("chat", start=0.0)
    with pytest.raises(StreamError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        for line in lines:
            m.feed_line(line, 0.1)
        m.finish(0.2)


def test_prompts_are_seeded_and_lengths_in_range():
    w = Workload(input_len=100, output_len=50, range_ratio=0.5, seed=3)
    a, b = PromptSource(w, salt="r0"), PromptSource(w, salt="r0")
    assert [a.get(i) for i in range(20)] == [b.get(i) for i in range(20)]
    assert a.get(0) != PromptSource(w, salt="r1").get(0)  # repeats get fresh prompts (no prefix-cache hits)
    specs = [a.get(i) for i in range(200)]
    assert all(50 <= len(s.prompt.split()) <= 100 and 25 <= s.output_len <= 50 for s in specs)
    fixed = PromptSource(Workload(input_len=7, output_len=5)).get(0)
    assert (len(fixed.prompt.split()), fixed.output_len) == (7, 5)
    path, body = request_for(w, a.get(0), "m")
    assert path == "/v1/chat/completions"
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] and body["min_tokens"] == body["max_tokens"]


def test_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello", "output_len": 3}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    w = Workload(output_len=9).with_prompt_file(str(f))
    src = PromptSource(w)
    assert (src.get(0).prompt, src.get(0).output_len) == ("hello", 3)
    assert (src.get(1).messages[0]["content"], src.get(1).output_len) == ("hi", 9)
    assert src.get(2).prompt == "hello"  # cycles
    assert len(w.prompt_file_sha256) == 64
    f.write_text('["not an object"]\n')
    with pytest.raises(ValueError, match="expected a JSON object"):
        PromptSource(Workload().with_prompt_file(str(f)))


@pytest.mark.parametrize(
    "content, message",
    [
        # (file content, or None: no such file / "DIR": a folder; the error, which names the file)
        (None, "cannot read it (No such file or directory)"),
        ("DIR", "cannot read it (Is a directory)"),
        ('{"prompt": "a"}\nnot json\n', "p.jsonl:2: not JSON (Expecting value)"),
        ("\n\n", "p.jsonl: no prompts"),
        ("\ufeff" + '{"prompt": "a"}\nnot json\n', "p.jsonl:2: not JSON"),  # a byte-order mark is no error
    ],
)
def test_a_bad_prompt_file_is_named_before_anything_runs(tmp_path, content, message):
    # with_prompt_file is what `loadtest run` calls before it creates the results folder or sends a request
    f = tmp_path / "p.jsonl"
    if content == "DIR":
        f.mkdir()
    elif content is not None:
        f.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        Workload().with_prompt_file(str(f))


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):  # 1 and 2: the interpolation edges
        v = sorted(rng.random(n).tolist())
        for p in (0, 50, 90, 99, 100):
            assert metrics.percentile(v, p) == pytest.approx(np.percentile(v, p))
    assert math.isnan(metrics.percentile([], 50))


# --- synthetic results folders -------------------------------------------------------------------


def _write_folder(path: Path, speed: float, *, output_len: int = 64, model: str = "m", levels=(1, 8)) -> Path:
    """A closed-loop run where every duration is divided by `speed`: throughput is exactly `speed` x base."""
    workload = Workload(input_len=128, output_len=output_len)
    meta = {"tag": path.name, "model": model, "model_path": model, "workload": workload.to_dict(),
            "concurrency": list(levels), "duration_s": 10.0, "repeats": 3}  # fmt: skip
    rows = []
    for c in levels:
        for rep in range(3):
            jitter = 1.0 + 0.03 * rep  # repeats differ (a spread to report), equally on both sides
            ttft, gap = 0.2 * jitter / speed, 0.02 * jitter * (1 + 0.05 * c) / speed
            e2e = ttft + (output_len - 1) * gap
            for user in range(c):
                t = 1000.0 + 0.001 * user / speed
                while t < 1000.0 + 10.0 / speed:
                    rows.append({"concurrency": c, "repeat": rep, "start_unix": t, "ok": True, "ttft": ttft,
                                 "itl": [gap] * (output_len - 1), "tpot": gap, "e2e": e2e,
                                 "output_tokens": output_len, "output_chunks": output_len, "input_tokens": 130,
                                 "expected_output_tokens": output_len, "status": 200, "error": None})  # fmt: skip
                    t += e2e
            rows.append({"concurrency": c, "repeat": rep, "start_unix": 1000.0, "ok": False, "status": 500,
                         "error": "HTTP 500: boom", "e2e": 0.001})  # fmt: skip
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(meta))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_compare_reports_known_gain_and_plots(tmp_path, capsys):
    base = _write_folder(tmp_path / "baseline", 1.0)
    patched = _write_folder(tmp_path / "patched", 1.3)
    out = tmp_path / "cmp"
    args = ["loadtest", "compare", str(base), str(patched), "--out", str(out), "--slo-ttft-ms", "180"]
    assert main([*args, "--slo-tpot-ms", "100"]) == 0
    rep = json.loads((out / "report.json").read_text())
    for level in rep["levels"]:
        assert level["gain_output_throughput"]["mean"] == pytest.approx(1.3, rel=0.01)
        assert level["gain_request_throughput"]["mean"] == pytest.approx(1.3, rel=0.02)
        g = level["gain_output_throughput"]
        assert g["low"] < 1.3 < g["high"]  # the spread of the repeats shows
        assert level["baseline"]["failure_kinds"] == {"HTTP 500": 3}
    text = (out / "report.md").read_text()
    assert "Output-token throughput gain: 1.30x" in text
    assert "**1.30x**" in text
    # goodput: baseline TTFT 200-212 ms misses the 180 ms SLO, patched (154-163 ms) meets it
    assert rep["levels"][0]["baseline"]["goodput"]["mean"] == 0.0 and rep["levels"][0]["patched"]["goodput"]["mean"] > 0
    for name in report.PLOTS:
        assert (out / name).stat().st_size > 1000
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1.30x" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"output_len": 32}, "refusing to compare runs with different workloads: output_len 64 vs 32"),
        ({"model": "other"}, "refusing to compare runs of different models: 'm' vs 'other'"),
        ({"levels": (2,)}, "no concurrency level in common"),
    ],
)
def test_compare_refuses_mismatched_runs(tmp_path, capsys, kwargs, message):
    base = _write_folder(tmp_path / "baseline", 1.0)
    patched = _write_folder(tmp_path / "patched", 1.3, **kwargs)
    assert main(["loadtest", "compare", str(base), str(patched), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cmp" / "report.md").exists()


def test_compare_rejects_a_folder_that_is_not_results(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    base = _write_folder(tmp_path / "baseline", 1.0)
    assert main(["loadtest", "compare", str(base), str(tmp_path / "empty")]) == 2
    assert "is not a load-test results folder" in capsys.readouterr().err


def test_compare_refuses_damaged_and_empty_runs(tmp_path, capsys):
    base = _write_folder(tmp_path / "baseline", 1.0)
    patched = _write_folder(tmp_path / "patched", 1.3)
    (tmp_path / "a_file").write_text("")
    assert main(["loadtest", "compare", str(base), str(patched), "--out", str(tmp_path / "a_file")]) == 2
    assert "cannot make a folder there" in capsys.readouterr().err
    with (patched / "requests.jsonl").open("a") as f:
        f.write("{truncated\n")
    assert main(["loadtest", "compare", str(base), str(patched)]) == 2
    err = capsys.readouterr().err
    assert "requests.jsonl:" in err and "not JSON" in err and len(err.strip().splitlines()) == 1
    # a run in which every request failed (a server down, a timeout too short) once reported "nanx the throughput"
    lines = (base / "requests.jsonl").read_text().splitlines()
    failed = [json.dumps({**json.loads(x), "ok": False, "status": 0, "error": "timeout"}) for x in lines]
    (base / "requests.jsonl").write_text("\n".join(failed) + "\n")
    assert main(["loadtest", "compare", str(base), str(_write_folder(tmp_path / "patched2", 1.3))]) == 2
    assert "no request of this run succeeded" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--repeats=0", "--duration=-1", "--request-timeout=0", "--output-len=0"])
def test_run_refuses_counts_and_times_that_cannot_work(option, capsys):
    with pytest.raises(SystemExit) as e:
        main(["loadtest", "run", "--host", "http://127.0.0.1:9", "--tag", "x", option])
    assert e.value.code == 2 and "expected a positive" in capsys.readouterr().err


def test_cli_imports_nothing_heavy():
    code = (
        "import sys, sglang_glm5.cli as c; c.build_parser(); "
        "bad = [m for m in ('locust', 'gevent', 'matplotlib', 'torch') if m in sys.modules]; "
        "assert 'sglang_glm5.loadtest.cli' in sys.modules and not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
