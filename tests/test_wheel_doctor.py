"""``sglang-glm5 doctor --no-gpu`` from a wheel install finds the shipped autotune caches.

The wheel is built from a copy of the sources and installed with ``pip install --target`` into a
temporary folder; doctor then runs from there (PYTHONPATH first, another folder as the working
directory), where no source tree lies beside the package: the caches must come through
importlib.resources, as they do for every pip user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "sglang_glm5", "kernels", "patches", "loadtest", "configs")


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    """A folder holding the package as `pip install --target` puts it from a freshly built wheel."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (--no-build-isolation)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.lock"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-w", str(tmp / "dist"), str(src)])
    (wheel,) = (tmp / "dist").glob("sglang_glm5-*.whl")
    site = tmp / "site"
    _run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)])
    return site


def test_doctor_counts_the_shipped_caches_from_a_wheel_install(wheel_site, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(wheel_site),
        "CUDA_VISIBLE_DEVICES": "",  # the no-GPU branch of the cache check, also on a GPU machine
        "SGLANG_GLM5_CACHE_DIR": str(tmp_path / "cache"),  # an empty user cache
    }
    env.pop("TRITON_INTERPRET", None)
    code = (
        "import sys, sglang_glm5; print('package', sglang_glm5.__file__); "
        "from sglang_glm5.cli import main; sys.exit(main(['doctor', '--no-gpu']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    out = done.stdout
    assert done.returncode in (0, 1), f"doctor crashed ({done.returncode}):\n{out}\n{done.stderr}"
    package = Path(out.split("package ", 1)[1].splitlines()[0])
    assert package.is_relative_to(wheel_site), f"imported {package}, not the wheel install under {wheel_site}"
    installed = wheel_site / "sglang_glm5" / "configs" / "autotune"
    line = next((ln for ln in out.splitlines() if "cache:" in ln), None)
    assert line is not None, out
    # What the repository ships, counted here by owner (the first two fields of each key).
    shipped = sorted((ROOT / "configs" / "autotune").glob("*.json"))
    owners: dict[str, int] = {}
    for path in shipped:
        for key in json.loads(path.read_text())["entries"]:
            owner = "|".join(key.split("|")[:2])
            owners[owner] = owners.get(owner, 0) + 1
    assert sorted(p.name for p in installed.glob("*.json")) == [p.name for p in shipped]
    assert line.startswith("[  ok] cache: no GPU to match"), line
    assert f"shipped {len(shipped)} file(s), {sum(owners.values())} entries" in line, line
    for owner, count in owners.items():
        assert f"{owner}: {count}" in line, line
    assert f"under {installed}" in line and "user 0 file(s), 0 entries" in line, line
