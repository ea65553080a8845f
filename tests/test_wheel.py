"""The package as a user gets it from `pip install .`: a wheel, installed non-editable (into a target folder,
next to this Python's own site-packages, so nothing is downloaded), then `sglang-glm5 tune` with a fresh
cache from the repository root, whose sglang_glm5/ folder lacks the subpackages the wheel maps into it,
and from elsewhere; then `doctor --no-gpu` counts the shipped caches inside the installed package.

About a minute on a 2-core CPU: the wheel build, and two offline tunes of one bucket (two compiles each).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# What `pip install .` reads: the build configuration and every folder pyproject maps into the package.
SOURCES = ("pyproject.toml", "README.md", "sglang_glm5", "kernels", "patches", "loadtest", "configs")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (the checkout stays clean), installed under a target folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = (tmp / "dist").glob("sglang_glm5-*.whl")
    target = tmp / "site"
    run = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert (target / "sglang_glm5" / "kernels" / "nvfp4_moe.py").is_file()  # mapped in by package-dir
    _hide_editable_installs(target)
    return target


def _hide_editable_installs(target: Path) -> None:
    """An editable install of this package (scripts/dev_setup.sh makes one) adds an import hook that would
    supply ``sglang_glm5.kernels`` to a process that picked up the checkout's ``sglang_glm5/`` folder, and
    hide the very failure a user without it meets. Its ``.pth`` line imports a finder module by name: a
    module of that name earlier on the path, doing nothing, keeps the hook out."""
    folders = {*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_path("purelib")}
    for folder in map(Path, folders):
        for finder in folder.glob("__editable___sglang_glm5_*_finder.py") if folder.is_dir() else ():
            (target / finder.name).write_text("def install():\n    pass  # the editable install's hook, left out\n")


def _run(target: Path, cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "SGLANG_GLM5_CACHE_DIR": str(cache)}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    environ.pop("TRITON_INTERPRET", None)  # as a user's shell has it
    script = target / "bin" / "sglang-glm5"  # the console script, as `pip install` writes it
    return subprocess.run([str(script), *args], cwd=cwd, capture_output=True, text=True, env=environ, timeout=600)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("where", ["repository root", "elsewhere"])
def test_tune_from_an_installed_wheel(installed, tmp_path, where):
    cwd = REPO if where == "repository root" else tmp_path
    cache = tmp_path / "cache"
    shipped = REPO / "configs" / "autotune" / "rtx-pro-6000.json"
    before = _digest(shipped)
    # One bucket keeps it short; the compile worker (a subprocess) still runs: the cache is fresh.
    out = _run(installed, cwd, cache, "tune", "--batch-sizes", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    entries = json.loads((cache / "autotune" / "rtx-pro-6000.json").read_text())["entries"]
    assert {key.split("|")[2].split(".")[0] for key in entries if key.endswith("|m=1")} == {"gemm1", "gemm2"}
    memo = json.loads((cache / "aot_shared.json").read_text())  # written from the worker's compiles
    assert len(memo) >= 2 and all(isinstance(v, int) and v > 0 for v in memo.values())
    assert _digest(shipped) == before, "tune wrote into the repository"


def test_doctor_counts_the_shipped_caches_of_the_installed_package(installed, tmp_path):
    out = _run(installed, REPO, tmp_path / "cache", "doctor", "--no-gpu")
    assert "Traceback" not in out.stderr, out.stderr
    package = installed.resolve() / "sglang_glm5"
    assert "package: sglang-glm5 " in out.stdout and f"from {package} (installed)" in out.stdout, out.stdout
    # What the repository ships, counted here by owner (the first two fields of each key: a device, or an
    # architecture and its shared memory), against what doctor counts inside the installed package.
    shipped = sorted((REPO / "configs" / "autotune").glob("*.json"))
    owners: dict[str, int] = {}
    for path in shipped:
        for key in json.loads(path.read_text())["entries"]:
            owner = "|".join(key.split("|")[:2])
            owners[owner] = owners.get(owner, 0) + 1
    installed_caches = package / "configs" / "autotune"
    assert sorted(p.name for p in installed_caches.glob("*.json")) == [p.name for p in shipped]
    line = next((ln for ln in out.stdout.splitlines() if "cache: no GPU to match" in ln), None)
    assert line is not None and line.startswith("[  ok]"), out.stdout
    assert f"shipped {len(shipped)} file(s), {sum(owners.values())} entries" in line, line
    assert f"under {installed_caches}" in line, line
    for owner, count in owners.items():
        assert f"{owner}: {count}" in line, line
