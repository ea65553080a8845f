"""`sglang-glm5 loadtest run` end to end against a fake SGLang server on 127.0.0.1 with known delays.

Locust runs in a subprocess (as `loadtest run` always does), so its gevent patching stays out of
pytest. Each run is a few seconds; the whole file takes about 30 s on 2 cores.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from loadtest_server import FakeSGLang

TTFT, GAP, TOKENS = 0.100, 0.020, 16  # injected: first token after 100 ms, then one every 20 ms


def _run(host: str, out: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sglang_glm5.cli", "loadtest", "run", "--host", host, "--out", str(out)]
    cmd += ["--repeats", "1", "--warmup", "0", "--input-len", "20", "--output-len", str(TOKENS), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _close(measured: float, injected: float) -> bool:
    """The accuracy bar: within 10 % or 5 ms of the injected value."""
    return abs(measured - injected) <= max(0.10 * injected, 5.0)


@pytest.mark.parametrize("mode", ["chat", "generate"])  # OpenAI streaming, and SGLang's native /generate
def test_measures_injected_latency_and_throughput(tmp_path, mode):
    with FakeSGLang(ttft=TTFT, gap=GAP) as server:
        levels = "1,16" if mode == "chat" else "4"
        proc = _run(server.url, tmp_path, "--tag", "t", "--mode", mode, "--concurrency", levels, "--duration", "4",
                    "--flush-cache")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.flushes == len(levels.split(","))
    folder = tmp_path / "t"
    summary = json.loads((folder / "summary.json").read_text())
    e2e_ms = (TTFT + (TOKENS - 1) * GAP) * 1e3
    for users, level in summary["levels"].items():
        expected = {"ttft_ms": TTFT * 1e3, "itl_ms": GAP * 1e3, "tpot_ms": GAP * 1e3, "e2e_ms": e2e_ms}
        report = {k: (level[k]["mean"], level[k]["p50"], v) for k, v in expected.items()}
        print(f"{mode} c={users}: measured (mean, p50, injected) ms {report}")
        for key, injected in expected.items():
            assert _close(level[key]["mean"], injected), (users, key, level[key])
            assert _close(level[key]["p50"], injected), (users, key, level[key])
        tput = level["output_throughput"]["mean"]
        injected_tput = int(users) * TOKENS / (e2e_ms / 1e3)  # closed loop, no think time
        print(f"{mode} c={users}: output throughput {tput:.1f} tok/s, injected {injected_tput:.1f}")
        assert abs(tput - injected_tput) <= 0.10 * injected_tput
        assert level["failed"] == 0 and level["ok"] > 0 and level["output_tokens_mismatch"] == 0
    records = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert all(r["output_tokens"] == TOKENS and r["tokens_from"] == "usage" for r in records)
    assert all(len(r["itl"]) == TOKENS - 1 for r in records)
    assert json.loads((folder / "server_info.json").read_text())["model_path"] == "fake/GLM-5-NVFP4"
    run = json.loads((folder / "run.json").read_text())
    assert run["model"] == "fake/GLM-5-NVFP4" and run["workload"]["mode"] == mode
    command = (folder / "command.txt").read_text()
    assert command.startswith("sglang-glm5 loadtest run --host http://127.0.0.1:") and "-m locust" in command


def test_failures_are_counted_not_crashes(tmp_path):
    behaviours = ("ok", "close", "500", "malformed", "hang")
    with FakeSGLang(ttft=0.02, gap=0.01, behaviours=behaviours) as server:
        proc = _run(server.url, tmp_path, "--tag", "f", "--concurrency", "2", "--duration", "4",
                    "--request-timeout", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    level = json.loads((tmp_path / "f" / "summary.json").read_text())["levels"]["2"]
    print(level["failure_kinds"], level["failure_examples"])
    kinds = level["failure_kinds"]
    assert kinds.get("HTTP 500", 0) > 0
    assert kinds.get("malformed chunk", 0) > 0
    assert kinds.get("timeout", 0) > 0
    assert sum(v for k, v in kinds.items() if k.startswith("connection closed mid-stream")) > 0
    assert level["ok"] > 0 and level["failed"] == sum(kinds.values())
    records = [json.loads(x) for x in (tmp_path / "f" / "requests.jsonl").read_text().splitlines()]
    assert all(r["ok"] == (r["error"] is None) for r in records)
    timeouts = [r for r in records if (r["error"] or "").startswith("timeout")]
    assert all(0.9 < r["e2e"] < 2.0 for r in timeouts)  # failed after --request-timeout, not later
    for name in ("run.json", "summary.json", "server_info.json", "command.txt"):
        assert (tmp_path / "f" / name).stat().st_size > 0


def test_a_run_in_which_nothing_succeeds_fails(tmp_path):
    # Every request answered with HTTP 500: the records are kept, the exit status says the run measured nothing.
    with FakeSGLang(ttft=0.02, gap=0.01, behaviours=("500",)) as server:
        proc = _run(server.url, tmp_path, "--tag", "down", "--concurrency", "1", "--duration", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "c=1 repeat 1/1: no request succeeded" in proc.stdout
    level = json.loads((tmp_path / "down" / "summary.json").read_text())["levels"]["1"]
    assert level["ok"] == 0 and level["failure_kinds"].get("HTTP 500", 0) == level["failed"] > 0


def test_run_against_a_closed_port_exits_with_one_line(tmp_path):
    with socket.socket() as s:  # a port where nothing listens: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = _run(f"http://127.0.0.1:{port}", tmp_path, "--tag", "x", timeout=30)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        lines[0]
        == f"sglang-glm5 loadtest run: no server answering at http://127.0.0.1:{port} (/health: Connection refused)"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("example", ["requests_client.py", "openai_client.py"])
def test_examples_run_against_the_fake_server(example):
    if example == "openai_client.py":
        pytest.importorskip("openai")
    script = Path(__file__).parent.parent / "examples" / example
    with FakeSGLang(ttft=0.01, gap=0.001) as server:
        proc = subprocess.run([sys.executable, str(script), "--url", server.url, "--max-tokens", "5"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " tok tok tok tok tok" in proc.stdout
