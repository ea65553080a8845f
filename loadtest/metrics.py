"""Per-request JSONL records -> the figures of a run. Every number in a summary or report comes from here.

A results folder holds `run.json` (what was run: workload, model, levels, duration, repeats) and
`requests.jsonl` (one record per request, tagged with its concurrency and repeat).

Throughput is counted inside each run's steady-state window: from the moment every user has sent
its first request to the moment the last request was sent (after it Locust is stopping and fewer
users are busy). Output tokens count when they arrive inside the window (token times are rebuilt
from TTFT and the inter-token gaps), so ramp-up, and requests still running when Locust stops,
neither inflate nor deflate the rate. Requests per second and goodput count requests that completed
inside the window. Latency statistics pool
every successful request of all repeats. Only successful requests count towards throughput.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_glm5._files import read_json

RUN_FILE = "run.json"
RECORDS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Slo:
    """Goodput counts requests with TTFT <= ttft_ms and TPOT <= tpot_ms (a None bound is not checked)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, r: dict[str, Any]) -> bool:
        if self.ttft_ms is not None and r["ttft"] * 1e3 > self.ttft_ms:
            return False
        if self.tpot_ms is not None and r.get("tpot") is not None and r["tpot"] * 1e3 > self.tpot_ms:
            return False
        return True

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms}


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    rank = p / 100.0 * (len(sorted_values) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def distribution_ms(values_s: list[float]) -> dict[str, float]:
    v = sorted(x * 1e3 for x in values_s)
    mean = sum(v) / len(v) if v else math.nan
    return {"mean": mean, "p50": percentile(v, 50), "p90": percentile(v, 90), "p99": percentile(v, 99), "n": len(v)}


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "std": math.nan, "values": []}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "min": min(values), "max": max(values), "std": std, "values": values}


def failure_kind(reason: str) -> str:
    """A reason without its numbers: 'timeout', 'HTTP 500', 'connection closed mid-stream after N output chunks'."""
    if reason.startswith("HTTP "):
        return reason[:8]
    return re.sub(r"\d+(\.\d+)?", "N", reason.split(": ", 1)[0])


def _tokens_in_window(r: dict[str, Any], begin: float, end: float) -> float:
    """Output tokens of one request that arrived in [begin, end] (chunk times rebuilt from TTFT + gaps)."""
    per_chunk = r["output_tokens"] / max(1, r.get("output_chunks") or len(r["itl"]) + 1)
    t = r["start_unix"] + r["ttft"]
    n = int(begin <= t <= end)
    for gap in r["itl"]:
        t += gap
        if t > end:
            break
        n += t >= begin
    return n * per_chunk


def run_stats(records: list[dict[str, Any]], users: int, slo: Slo) -> dict[str, Any]:
    """One (concurrency, repeat) run, counted in its steady-state window (see the module docstring)."""
    ok = [r for r in records if r.get("ok")]
    starts = sorted(r["start_unix"] for r in records)
    if len(starts) < 2:
        return {"requests": len(records), "ok": len(ok), "failed": len(records) - len(ok), "completed_in_window": 0,
                "request_throughput": 0.0, "output_throughput": 0.0, "input_throughput": 0.0, "goodput": 0.0,
                "window_start_unix": None, "window_s": 0.0}  # fmt: skip
    begin = starts[min(users, len(starts) - 1) - 1] if users > 1 else starts[0]  # every user has sent one
    end = starts[-1]  # after the last request was sent Locust was stopping: fewer users were busy
    window = max(end - begin, 1e-9)
    done = [r for r in ok if begin <= r["start_unix"] + r["e2e"] <= end]
    out_tokens = sum(_tokens_in_window(r, begin, end) for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "completed_in_window": len(done),
        "request_throughput": len(done) / window,
        "output_throughput": out_tokens / window,
        "input_throughput": sum(r.get("input_tokens") or 0 for r in done) / window,
        "goodput": sum(1 for r in done if slo.met(r)) / window,
        "window_start_unix": begin,
        "window_s": window,
    }


def level_summary(records: list[dict[str, Any]], users: int, slo: Slo) -> dict[str, Any]:
    """One concurrency level: throughput with its spread over repeats, pooled latency distributions."""
    by_repeat: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_repeat.setdefault(r.get("repeat", 0), []).append(r)
    runs = [run_stats(by_repeat[k], users, slo) for k in sorted(by_repeat)]
    ok = [r for r in records if r.get("ok")]
    failed = [r for r in records if not r.get("ok")]
    mismatch = sum(1 for r in ok if r.get("expected_output_tokens") not in (None, r["output_tokens"]))
    return {
        "repeats": len(runs),
        "requests": len(records),
        "ok": len(ok),
        "failed": len(failed),
        "failure_kinds": dict(Counter(failure_kind(r.get("error") or "unknown") for r in failed)),
        "failure_examples": sorted({r.get("error") or "unknown" for r in failed})[:5],
        "output_tokens_mismatch": mismatch,
        **{k: spread([run[k] for run in runs]) for k in THROUGHPUTS},
        "ttft_ms": distribution_ms([r["ttft"] for r in ok]),
        "itl_ms": distribution_ms([g for r in ok for g in r["itl"]]),
        "tpot_ms": distribution_ms([r["tpot"] for r in ok if r.get("tpot") is not None]),
        "e2e_ms": distribution_ms([r["e2e"] for r in ok]),
        "runs": runs,
    }


THROUGHPUTS = ("request_throughput", "output_throughput", "input_throughput", "goodput")


def load_results(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(run.json, records) of a results folder; a clear error when it is not one."""
    run_path, rec_path = folder / RUN_FILE, folder / RECORDS_FILE
    if not run_path.is_file() or not rec_path.is_file():
        raise ValueError(f"{folder} is not a load-test results folder (expected {RUN_FILE} and {RECORDS_FILE})")
    meta = read_json(run_path)  # a JSON object, else a ValueError naming the file
    lines = enumerate(rec_path.read_text().splitlines(), 1)
    records = [_record(rec_path, n, line) for n, line in lines if line.strip()]
    return meta, records


def _record(path: Path, n: int, line: str) -> dict[str, Any]:
    """Line ``n`` of a records file as its JSON object; a ValueError naming the line otherwise."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e.msg}); the file is damaged") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
    return record


def summarize(meta: dict[str, Any], records: list[dict[str, Any]], slo: Slo) -> dict[str, Any]:
    levels: dict[int, list[dict[str, Any]]] = {c: [] for c in meta["concurrency"]}
    for r in records:
        levels.setdefault(r["concurrency"], []).append(r)
    return {
        "tag": meta.get("tag"),
        "model": meta.get("model"),
        "workload": meta.get("workload"),
        "duration_s": meta["duration_s"],
        "slo": slo.as_dict(),
        "units": "throughputs per second (tokens or requests); latencies in ms",
        "levels": {str(c): level_summary(rs, c, slo) for c, rs in sorted(levels.items())},
    }
