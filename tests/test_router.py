"""`sglang-glm5 router`: the real router (SGLang's Model Gateway, PyPI smg, a Rust binary in the wheel) on the CPU,
in front of two fake SGLang servers (tests/loadtest_server.py, each a process of its own), all on 127.0.0.1.

Bounded: two workers that stop themselves after WORKER_LIFETIME seconds, one router stopped at the end of the
module (SIGTERM, then SIGKILL), a few dozen requests, every subprocess and HTTP call with a timeout. ~40 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from sglang_glm5 import cli, router

pytest.importorskip("smg", reason="the router is not installed: pip install 'sglang-glm5[router]'")

HERE = Path(__file__).resolve().parent
WORKER_LIFETIME = 150  # seconds: a worker left behind by a crashed test stops itself
TTFT, GAP = 0.05, 0.02  # the fake workers' first token after 50 ms, then one every 20 ms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def _post(url: str, body: dict, timeout: float = 10) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


class Worker:
    """A fake SGLang server in its own process."""

    def __init__(self):
        cmd = [sys.executable, str(HERE / "loadtest_server.py"), "--ttft", str(TTFT), "--gap", str(GAP),
               "--lifetime", str(WORKER_LIFETIME)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), f"worker did not start: {self.url!r}"

    def served(self) -> int:
        """Chat / generate requests this worker has received (its own count)."""
        return _get(f"{self.url}/fake_stats")["requests"]

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: its sockets close mid-stream, as a crashed server's do
        self.proc.wait(10)


@pytest.fixture(scope="module")
def fleet():
    """Two workers and the router in front of them, started through `sglang-glm5 router` (which execs smg)."""
    workers = [Worker(), Worker()]
    port, metrics = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "sglang_glm5.cli", "router", "--worker-urls", *(w.url for w in workers),
           "--port", str(port), "--metrics-port", str(metrics), "--", "--log-level", "warn"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # up when it answers /v1/models with the workers' model
            assert proc.poll() is None, f"router exited: {proc.stdout.read()}"
            try:
                if _get(f"{url}/v1/models", timeout=2).get("data"):
                    break
            except (OSError, urllib.error.URLError, json.JSONDecodeError):
                pass
            assert time.monotonic() < deadline, "router not up within 60 s"
            time.sleep(0.2)
        yield url, workers, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for w in workers:
            if w.proc.poll() is None:
                w.kill()


def _listening(pid: int) -> set[str]:
    """The local addresses (hex ip:port, as /proc/net/tcp* writes them) of a process's listening TCP sockets."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1])
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_router_listens_on_loopback_only(fleet):
    _, _, proc = fleet
    addresses = _listening(proc.pid)
    assert len(addresses) >= 2, addresses  # the API and the Prometheus metrics
    assert all(a.split(":")[0] == "0100007F" for a in addresses), addresses  # 127.0.0.1


def _chat(url: str, model: str, prompt: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "stream": False}
    status, reply = _post(f"{url}/v1/chat/completions", body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 4, reply
    return reply


def test_requests_through_the_router_reach_both_workers(fleet):
    url, workers, _ = fleet
    model = _get(f"{url}/v1/models")["data"][0]["id"]
    assert model == "fake/GLM-5-NVFP4"
    before = [w.served() for w in workers]
    n = 16
    for _ in range(n):  # unrelated prompts: no shared prefix, the router spreads them
        _chat(url, model, f"{uuid.uuid4().hex} " * 20)
    got = [w.served() - b for w, b in zip(workers, before, strict=True)]
    print("requests per worker:", got)
    assert sum(got) == n and all(g > 0 for g in got), got

    # cache-aware: prompts that share a long prefix stay on the worker that has it
    before = [w.served() for w in workers]
    prefix = f"{uuid.uuid4().hex} " * 40
    for i in range(6):
        _chat(url, model, f"{prefix} question {i}")
    got = [w.served() - b for w, b in zip(workers, before, strict=True)]
    assert sorted(got) == [0, 6], got


def _loadtest(url: str, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sglang_glm5.cli", "loadtest", "run", "--host", url, "--out", str(out),
           "--repeats", "1", "--warmup", "0", "--input-len", "20", "--output-len", "16", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]


def test_loadtest_through_the_router_records_every_request(fleet, tmp_path):
    url, workers, _ = fleet
    before = [w.served() for w in workers]
    proc = _loadtest(url, tmp_path, "--tag", "routed", "--concurrency", "4", "--duration", "4")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    records = _records(tmp_path / "routed")
    got = [w.served() - b for w, b in zip(workers, before, strict=True)]
    print(f"{len(records)} records, requests per worker {got}")
    assert records and all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]][:3]
    assert len(records) == sum(got) and all(g > 0 for g in got)  # every request the workers served is recorded
    assert all(r["output_tokens"] == 16 for r in records)


def test_a_worker_killed_mid_run_shows_as_failed_requests(fleet, tmp_path):
    """Last in the module: it kills a worker. The run ends on time; the requests the dead worker held fail, the
    rest (on the live worker) succeed."""
    url, workers, _ = fleet
    duration, timeout = 6, 5
    started = time.monotonic()
    proc = _loadtest(url, tmp_path, "--tag", "killed", "--concurrency", "6", "--duration", str(duration),
                     "--request-timeout", str(timeout))  # fmt: skip
    time.sleep(3)  # Locust's start-up plus a couple of seconds of traffic on both workers
    victim = workers[1]
    served_before_kill = victim.served()
    victim.kill()
    killed_at = time.time()
    out, _ = proc.communicate(timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, out
    records = _records(tmp_path / "killed")
    failed = [r for r in records if not r["ok"]]
    ok_after = [r for r in records if r["ok"] and r["start_unix"] > killed_at]
    print(f"{len(records)} records, {len(failed)} failed: {sorted({r['error'] for r in failed})}; "
          f"{len(ok_after)} ok after the kill; victim had served {served_before_kill}; {elapsed:.1f} s")  # fmt: skip
    assert served_before_kill > 0
    assert failed, "the killed worker's in-flight requests must show as failures"
    assert all(r["error"] for r in failed) and ok_after, "the live worker keeps serving"
    assert elapsed < 60, f"the run took {elapsed:.0f} s for a {duration} s test: something hung"
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())["levels"]["6"]
    assert summary["failed"] == len(failed) and summary["ok"] == len(records) - len(failed)


# ---------------------------------------------------------------------------------------------------------------
# The command itself, no processes.


def test_router_command(capsys):
    ports = [str(_free_port()), str(_free_port())]
    argv = ["router", "--worker-urls", "http://10.0.0.1:30000/", "https://node2:30000", "--port", ports[0],
            "--metrics-port", ports[1], "--api-key", "sek", "--dry-run", "--", "--cache-threshold", "0.5"]  # fmt: skip
    assert cli.main(argv) == 0
    shown = capsys.readouterr().out.strip().splitlines()[-1]
    assert shown == (
        f"python -m smg.launch_router --host 127.0.0.1 --port {ports[0]} --worker-urls http://10.0.0.1:30000 "
        f"https://node2:30000 --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port {ports[1]} "
        "--disable-tokenizer-autoload --api-key '<redacted>' --cache-threshold 0.5"
    )


@pytest.mark.parametrize(
    "urls, text",
    [
        (["http://10.0.0.1"], "expected http://HOST:PORT"),  # no port
        (["10.0.0.1:30000"], "expected http://HOST:PORT"),  # no scheme
        (["http://a:30000/v1"], "expected http://HOST:PORT"),  # a path
        (["http://a:30000", "http://a:30000/"], "given twice"),
    ],
)
def test_bad_worker_urls_are_one_clear_line(urls, text):
    out = subprocess.run([sys.executable, "-m", "sglang_glm5.cli", "router", "--worker-urls", *urls, "--dry-run"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().startswith("sglang-glm5 router: ") and text in out.stderr


@pytest.mark.parametrize(
    "host, text",
    [
        ("no-such-host.invalid", "--host no-such-host.invalid: not an address or a name this machine can resolve"),
        ("192.0.2.1", "--host 192.0.2.1: not an address of this machine"),  # TEST-NET-1: no real machine's
    ],
)
def test_a_bad_host_is_not_called_a_busy_port(capsys, host, text):
    argv = ["router", "--worker-urls", "http://10.0.0.1:30000", "--dry-run", "--host", host, "--port"]
    assert cli.main([*argv, str(_free_port()), "--metrics-port", str(_free_port())]) == 2
    err = capsys.readouterr().err
    assert text in err and "not free" not in err


def test_router_names_the_package_when_missing(monkeypatch, capsys):
    monkeypatch.setattr(router.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(os, "execvp", lambda *a: pytest.fail("exec without the router installed"))
    rc = cli.main(["router", "--worker-urls", "http://a:1", "--port", str(_free_port()),
                   "--metrics-port", str(_free_port())])  # fmt: skip
    assert rc == 2 and "pip install 'sglang-glm5[router]'" in capsys.readouterr().err


def test_router_script_dry_run():
    import sysconfig

    env = dict(os.environ, PATH=f"{sysconfig.get_path('scripts')}{os.pathsep}{os.environ['PATH']}",
               PORT=str(_free_port()), METRICS_PORT=str(_free_port()), POLICY="round_robin")  # fmt: skip
    script = str(HERE.parent / "scripts" / "router.sh")
    out = subprocess.run([script, "http://10.0.0.1:30000", "http://10.0.0.2:30000", "--dry-run", "--", "--log-level",
                          "warn"], capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    argv = out.stdout.strip().splitlines()[-1].split()
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == [
        "http://10.0.0.1:30000", "http://10.0.0.2:30000"
    ]  # fmt: skip
    assert argv[argv.index("--policy") + 1] == "round_robin" and argv[-2:] == ["--log-level", "warn"]
    out = subprocess.run([script, "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stderr
