"""Ahead-of-time compiles in worker processes: the one harness of every kernel family.

Triton compiles a kernel for any target without a GPU (``triton.compile`` with a ``GPUTarget``), but
not in a process where the kernels were defined under ``TRITON_INTERPRET=1`` (the CPU tests), and a
compiler crash must not take the caller down. So a family names a job function (``"module:function"``,
JSON in, JSON out) and ``run_jobs`` calls it in fresh processes (``python -P -m sglang_glm5.aot``, the
interpreter off), up to one per CPU core. A job that raises comes back as its error line, per job.

``memoized`` keeps sizes on disk ($SGLANG_GLM5_CACHE_DIR/aot_shared.json) under keys that carry the
Triton version and ``source_digest`` of the kernel file, so an edited kernel is compiled again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

MAX_WORKERS = 16


@functools.cache
def source_digest(module: str) -> str:
    """12 hex digits of the SHA-256 of a module's source file (the kernels' fingerprint in memo keys);
    read once per process, not once per memo key."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"source_digest: no source file for module {module!r}")
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:12]


def run_jobs(function: str, jobs: list[list]) -> list:
    """``function(*job)`` for each job, in worker processes; each result as JSON, or the job's error line
    (a str starting with the exception's type). Raises RuntimeError when a worker dies."""
    from sglang_glm5._proc import python_command

    if not jobs:
        return []
    workers = max(1, min(len(jobs), os.cpu_count() or 1, MAX_WORKERS))
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    procs = []
    for w in range(workers):
        payload = json.dumps({"function": function, "jobs": jobs[w::workers]})
        proc = subprocess.Popen(
            python_command("-m", "sglang_glm5.aot"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        procs.append((proc, payload))
    results: list = [None] * len(jobs)
    for w, (proc, payload) in enumerate(procs):
        out, err = proc.communicate(payload)
        if proc.returncode != 0:
            tail = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
            raise RuntimeError(f"ahead-of-time compile worker for {function} failed: {tail}")
        for i, value in enumerate(json.loads(out.strip().splitlines()[-1])):
            results[w + i * workers] = value  # worker w holds jobs w, w + workers, ...
    return results


def memoized(keys: list[str], compile_missing: Callable[[list[int]], list], *, memo: bool = True) -> list:
    """Values for ``keys`` from the on-disk memo ($SGLANG_GLM5_CACHE_DIR/aot_shared.json), computing the
    missing ones in one ``compile_missing(indices) -> values`` call; only int values (sizes) are stored."""
    from sglang_glm5._files import cache_dir, read_json, update_json

    path = cache_dir() / "aot_shared.json"
    known: dict = {}
    if memo:
        try:
            known = read_json(path)
        except (FileNotFoundError, ValueError):
            known = {}
    missing = sorted({i for i, key in enumerate(keys) if not isinstance(known.get(key), int)})
    if missing:
        new = {keys[i]: v for i, v in zip(missing, compile_missing(missing), strict=True)}
        known = {**known, **new}
        if memo:
            update_json(path, lambda d: d.update({k: v for k, v in new.items() if isinstance(v, int)}))
    return [known[key] for key in keys]


def _worker() -> None:
    """python -m sglang_glm5.aot: {"function": "module:name", "jobs": [[...], ...]} on stdin; the results
    as a JSON list on the last line of stdout."""
    request = json.load(sys.stdin)
    module, name = request["function"].split(":")
    fn = getattr(importlib.import_module(module), name)
    results = []
    for job in request["jobs"]:
        try:
            results.append(fn(*job))
        except Exception as exc:  # noqa: BLE001 - reported per job: a target may refuse one config
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            results.append(f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400])
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    _worker()
