"""The layout in docs/structure.md names every top-level folder and every module of sglang_glm5/, and
names no module that is not there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _layout() -> str:
    text = (ROOT / "docs" / "structure.md").read_text()
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def _tracked_top_level() -> set[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    return {line.split("/", 1)[0] + ("/" if "/" in line else "") for line in out.splitlines()}


def test_every_top_level_folder_is_in_the_layout():
    lines = _layout().splitlines()
    named = {line.split()[0] for line in lines if line and not line.startswith(" ")}
    folders = {name for name in _tracked_top_level() if name.endswith("/") and not name.startswith(".")}
    assert folders, "git lists no folders"
    assert folders <= named, f"folders missing from the layout in docs/structure.md: {sorted(folders - named)}"


def test_the_layout_names_exactly_the_modules_of_sglang_glm5():
    block = _layout()
    package = block.split("sglang_glm5/", 1)[1].split("\nkernels/", 1)[0]
    named = set(re.findall(r"\b(\w+\.py)\b", package))
    present = {p.name for p in (ROOT / "sglang_glm5").glob("*.py") if p.name != "__init__.py"}
    assert named == present, f"missing from the layout: {sorted(present - named)}; not there: {sorted(named - present)}"
