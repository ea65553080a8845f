"""Ahead-of-time compiles in worker processes: the one harness of every kernel family.

Triton compiles a kernel for any target without a GPU (``triton.compile`` with a ``GPUTarget``), but
not in a process where the kernels were defined under ``TRITON_INTERPRET=1`` (the CPU tests), and a
compiler crash must not take the caller down. So a family names a job function (``"module:function"``,
JSON in, JSON out) and ``run_jobs`` calls it in fresh processes (``python -P -m sglang_glm5.aot``, the
interpreter off), up to one per CPU core. A job that raises comes back as its error line, per job.

``memoized`` keeps sizes on disk ($SGLANG_GLM5_CACHE_DIR/aot_shared.json) under keys that carry the
Triton version and ``source_digest`` of the kernel file and the package modules it imports, so an edited kernel (or
an edited helper it imports) is compiled again.
"""

from __future__ import annotations

import ast
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


PACKAGE = "sglang_glm5"


@functools.cache
def source_digest(module: str) -> str:
    """12 hex digits of the SHA-256 of a module's source file and of every module of the package it imports, directly
    or not (``package_sources``): the kernels' fingerprint in memo keys, so that an edit to a helper a kernel file
    imports compiles it again too; read once per process, not once per memo key."""
    digest = hashlib.sha256()
    for path in package_sources(module):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def package_sources(module: str) -> list[Path]:
    """The source files of ``module`` and of the package's modules its ``import`` statements name (anywhere in the
    file, read with ``ast``), transitively, in the order first reached."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen[name] = path = _source_file(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += _package_imports(ast.parse(path.read_text(), str(path)), package)
    return list(seen.values())


def _source_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"source_digest: no source file for module {module!r}")
    return Path(spec.origin)


def _package_imports(tree: ast.Module, package: str) -> list[str]:
    """The package's modules that a module's import statements name (``package``: the one it is in, for relative
    imports): ``import m``, ``from m import x`` and, where m is a package, ``from m import sub``."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names += [base, *(f"{base}.{alias.name}" for alias in node.names if _is_submodule(base, alias.name))]
    return [n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]


def _is_submodule(base: str, name: str) -> bool:
    """Whether ``from base import name`` names a module of the package (base one of its packages)."""
    if base.split(".")[0] != PACKAGE:
        return False
    spec = importlib.util.find_spec(base)
    folders = (spec.submodule_search_locations or []) if spec else []
    return any((Path(folder) / f"{name}.py").is_file() for folder in folders)


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
