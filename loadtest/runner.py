"""`sglang-glm5 loadtest run`: a concurrency sweep with repeats, each run a headless Locust subprocess.

Locust runs in a subprocess so that its gevent monkey-patching never touches this process. The
results folder (`--out/--tag`) holds:
    run.json          what was run: workload, model, levels, duration, repeats, host, versions
    requests.jsonl    one record per request, tagged with concurrency and repeat (source of truth)
    summary.json      metrics.summarize() of the records
    server_info.json  the server's /get_server_info
    command.txt       the exact command, and each Locust command it ran
    runs/             each run's Locust log and raw records
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sglang_glm5 import env
from sglang_glm5._proc import python_command
from sglang_glm5.loadtest import metrics
from sglang_glm5.loadtest.workload import PromptSource, Workload, request_for

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
API_KEY_ENV = env.API_KEY.name


class ServerDown(Exception):
    """The server did not answer /health; the message is one line for the user."""


def _http(
    url: str, body: dict[str, Any] | None = None, api_key: str | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_health(host: str, api_key: str | None, timeout: float = 10.0) -> None:
    try:
        status, body = _http(f"{host}/health", api_key=api_key, timeout=timeout)
    except urllib.error.URLError as e:
        reason = e.reason.strerror if isinstance(e.reason, OSError) and e.reason.strerror else e.reason
        raise ServerDown(f"no server answering at {host} (/health: {reason})") from None
    except (TimeoutError, OSError) as e:
        raise ServerDown(f"no server answering at {host} (/health: {type(e).__name__}: {e})") from None
    if status != 200:
        raise ServerDown(f"server at {host} is not healthy (/health returned HTTP {status}: {body[:100]!r})")


def server_info(host: str, api_key: str | None) -> dict[str, Any]:
    """/get_server_info (SGLang), else /server_info; the error when neither answers."""
    for path in ("/get_server_info", "/server_info"):
        try:
            status, body = _http(f"{host}{path}", api_key=api_key)
        except (urllib.error.URLError, OSError) as e:
            return {"error": f"{path}: {e}"}
        if status == 200:
            return json.loads(body)
    return {"error": f"/get_server_info and /server_info returned HTTP {status}"}


def served_model(host: str, api_key: str | None) -> str | None:
    try:
        status, body = _http(f"{host}/v1/models", api_key=api_key)
        if status == 200:
            return json.loads(body)["data"][0]["id"]
    except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
        pass  # the model name falls back to server_info's model_path, then "default"
    return None


def canonical_command(args: argparse.Namespace) -> str:
    """The `loadtest run` command that repeats this run (the API key is never written)."""
    parts = ["sglang-glm5", "loadtest", "run", "--host", args.host, "--tag", args.tag, "--out", args.out]
    parts += ["--concurrency", ",".join(map(str, args.concurrency)), "--duration", f"{args.duration:g}"]
    parts += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--mode", args.mode]
    parts += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    parts += ["--range-ratio", f"{args.range_ratio:g}", "--seed", str(args.seed)]
    parts += ["--request-timeout", f"{args.request_timeout:g}"]
    for flag, value in (("--prompt-file", args.prompt_file), ("--model", args.model)):
        if value:
            parts += [flag, value]
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if value is not None:
            parts += [flag, f"{value:g}"]
    parts += ["--flush-cache"] if args.flush_cache else []
    parts += ["--no-ignore-eos"] if args.no_ignore_eos else []
    return shlex.join(parts)


def locust_command(
    host: str, workload: Workload, model: str, users: int, duration: float, timeout: float, records: Path, salt: str
) -> list[str]:
    cmd = python_command("-m", "locust", "-f", str(LOCUSTFILE), "--host", host, "--headless")
    cmd += ["-u", str(users), "-r", str(users * 20), "-t", f"{duration:g}s", "--stop-timeout", f"{timeout + 5:g}"]
    cmd += ["--exit-code-on-error", "0", "--only-summary", "--lt-mode", workload.mode]
    cmd += ["--lt-input-len", str(workload.input_len), "--lt-output-len", str(workload.output_len)]
    cmd += ["--lt-range-ratio", f"{workload.range_ratio:g}", "--lt-seed", str(workload.seed), "--lt-salt", salt]
    cmd += ["--lt-model", model, "--lt-timeout", f"{timeout:g}", "--lt-records", str(records)]
    if workload.prompt_file:
        cmd += ["--lt-prompt-file", workload.prompt_file]
    if not workload.ignore_eos:
        cmd += ["--lt-no-ignore-eos"]
    return cmd


def _count(path: Path) -> tuple[int, int]:
    if not path.exists():
        return 0, 0
    lines = path.read_text().splitlines()
    return len(lines), sum(1 for line in lines if '"ok": false' in line)


def _run_locust(cmd: list[str], records: Path, log: Path, label: str, duration: float, timeout: float) -> int:
    """One Locust subprocess, with a progress line every 10 s; returns its exit code."""
    environ = dict(os.environ)
    with log.open("w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=environ)
        t0 = time.monotonic()
        limit = duration + timeout + 120  # Locust stops itself at duration + stop timeout; this is a backstop
        next_report = 10.0
        while proc.poll() is None:
            time.sleep(0.2)
            elapsed = time.monotonic() - t0
            if elapsed >= next_report:
                n, failed = _count(records)
                print(f"  {label}: {elapsed:4.0f}/{duration:g} s, {n} requests done, {failed} failed", flush=True)
                next_report += 10.0
            if elapsed > limit:
                proc.kill()
                print(f"  {label}: Locust did not stop after {limit:.0f} s; killed it", flush=True)
                return proc.wait()
    return proc.returncode


def _warmup(host: str, workload: Workload, model: str, n: int, users: int, api_key: str | None, timeout: float) -> None:
    """n non-streamed requests (prompts apart from the measured ones) to load kernels and caches."""
    if n <= 0:
        return
    source = PromptSource(workload, salt="warmup")
    t0 = time.monotonic()

    def one(i: int) -> bool:
        path, body = request_for(workload, source.get(i), model, stream=False)
        try:
            return _http(f"{host}{path}", body, api_key, timeout)[0] == 200
        except (urllib.error.URLError, OSError):
            return False

    with ThreadPoolExecutor(max_workers=max(1, min(n, users))) as pool:
        ok = sum(pool.map(one, range(n)))
    print(f"warm-up: {n} requests, {n - ok} failed ({time.monotonic() - t0:.1f} s)", flush=True)


def server_url(option: str, url: str) -> str:
    """``url`` without a trailing slash; ValueError naming ``option`` unless it is an http(s) URL with a host."""
    host = url.rstrip("/")
    parsed = urllib.parse.urlsplit(host)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{option} {url}: expected a URL with its scheme, e.g. http://{host}")
    return host


def run(args: argparse.Namespace) -> int:
    host = server_url("--host", args.host)
    api_key = args.api_key or env.get(env.API_KEY)
    try:
        check_health(host, api_key)
    except ServerDown as e:
        print(f"sglang-glm5 loadtest run: {e}", file=sys.stderr)
        return 1
    workload = Workload(
        mode=args.mode,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        seed=args.seed,
        ignore_eos=not args.no_ignore_eos,
    ).with_prompt_file(args.prompt_file)
    folder = Path(args.out) / args.tag
    if folder.exists() and any(folder.iterdir()):
        if not args.overwrite:
            print(f"sglang-glm5 loadtest run: {folder} exists; pick another --tag or pass --overwrite", file=sys.stderr)
            return 1
        shutil.rmtree(folder)
    (folder / "runs").mkdir(parents=True)
    info = server_info(host, api_key)
    (folder / "server_info.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    model = args.model or served_model(host, api_key) or info.get("model_path") or "default"
    meta = {
        "tag": args.tag,
        "host": host,
        "model": model,
        "model_path": info.get("model_path", model),
        "workload": workload.to_dict(),
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "flush_cache": args.flush_cache,
        "request_timeout_s": args.request_timeout,
        "slo": metrics.Slo(args.slo_ttft_ms, args.slo_tpot_ms).as_dict(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "client_host": platform.node(),
    }
    (folder / metrics.RUN_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    command_lines = [canonical_command(args), ""]
    print(
        f"loadtest {args.tag}: {host}, model {model}, levels {args.concurrency}, {args.repeats} x {args.duration:g} s"
    )
    _warmup(host, workload, model, args.warmup, max(args.concurrency), api_key, args.request_timeout)
    slo = metrics.Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    all_records = folder / metrics.RECORDS_FILE
    all_records.touch()
    status = 0
    for users in args.concurrency:
        for rep in range(args.repeats):
            label = f"c={users} repeat {rep + 1}/{args.repeats}"
            if args.flush_cache:
                try:
                    code = _http(f"{host}/flush_cache", {}, api_key)[0]
                except (urllib.error.URLError, OSError) as e:
                    code = f"{type(e).__name__}: {e}"
                if code != 200:
                    print(f"  {label}: /flush_cache failed ({code}); the prefix cache may inflate this run")
            records = folder / "runs" / f"c{users}_r{rep}.jsonl"
            cmd = locust_command(host, workload, model, users, args.duration, args.request_timeout, records,
                                 salt=f"r{rep}")  # fmt: skip
            command_lines.append(shlex.join(cmd))
            rc = _run_locust(cmd, records, records.with_suffix(".log"), label, args.duration, args.request_timeout)
            rows = [json.loads(x) for x in records.read_text().splitlines() if x.strip()] if records.exists() else []
            with all_records.open("a") as f:
                for row in rows:
                    f.write(json.dumps({"concurrency": users, "repeat": rep, **row}) + "\n")
            if rc != 0:
                status = 1
                print(f"  {label}: Locust exited with {rc}; see {records.with_suffix('.log')}", flush=True)
            s = metrics.run_stats(rows, users, slo)
            if not s["ok"]:
                status = 1
                print(f"  {label}: no request succeeded (see {records.with_suffix('.log')})", flush=True)
            lat = metrics.distribution_ms([r["ttft"] for r in rows if r.get("ok")])
            tpot = metrics.distribution_ms([r["tpot"] for r in rows if r.get("ok") and r.get("tpot") is not None])
            print(
                f"  {label}: {s['ok']} ok, {s['failed']} failed, {s['output_throughput']:.1f} output tok/s, "
                f"{s['request_throughput']:.2f} req/s, TTFT p50 {lat['p50']:.0f} ms, TPOT p50 {tpot['p50']:.1f} ms",
                flush=True,
            )
    (folder / "command.txt").write_text("\n".join(command_lines) + "\n")
    meta["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    (folder / metrics.RUN_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    records_all = [json.loads(x) for x in all_records.read_text().splitlines() if x.strip()]
    summary = metrics.summarize(meta, records_all, slo)
    (folder / metrics.SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"loadtest {args.tag}: wrote {folder}/ ({len(records_all)} requests)")
    return status
