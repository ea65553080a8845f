"""The repository holds the product, not the lab notebook: bench/ stays small, docs pages stay short, and the
package's comments and docstrings name no run of the record (history lives in git and docs/lab.md)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH_MAX_FILES = 40
BENCH_MAX_BYTES = 400 * 1024
DOC_MAX_BYTES = 15 * 1024
PACKAGE_FOLDERS = ("sglang_glm5", "kernels", "patches", "loadtest")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".cfg", ".ini", ".html", ".j2"}

# "run 49", "runs 51-53", "Run 24:" name a run of the record. A count of things run ("runs 8 K steps", "run 2
# programs an SM") is not one: a number followed by one of these words is left alone.
RUN_REF = re.compile(
    r"\b[Rr]uns? \d+\b(?!\s*(?:x\b|K\b|k\b|times?\b|programs?\b|warps?\b|tiles?\b|launch(?:es)?\b|tokens?\b"
    r"|experts?\b|waves?\b|rounds?\b|steps?\b|stages?\b|blocks?\b|splits?\b|chains?\b|ranks?\b|GPUs?\b|workers?\b"
    r"|requests?\b|users?\b|seconds?\b|s\b|ms\b|us\b|minutes?\b|layers?\b|passes?\b|calls?\b|processes?\b))"
)


def tracked(folder: str) -> list[str]:
    """Files git tracks under ``folder``; skips the test outside a git checkout (an sdist, an unpacked wheel)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files of bench/ cannot be listed")
    out = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def test_run_ref_pattern_tells_history_from_counts():
    # History, as the record's comments wrote it: each must be caught.
    for text in ("(bench/README.md, run 47)", "runs 51-53: the chains", "Run 24: wgmma waits", "since run 9,"):
        assert RUN_REF.search(text), text
    # Counts of things a kernel or a load test runs: none may be caught.
    for text in ("each program runs 8 K steps", "the op runs 2 chains", "run 3 times", "runs 64 users", "run 4 x"):
        assert not RUN_REF.search(text), text


def test_bench_holds_at_most_40_tracked_files_and_400_kb():
    files = tracked("bench")
    sizes = {name: (ROOT / name).stat().st_size for name in files if (ROOT / name).is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    count = len(files)
    assert count <= BENCH_MAX_FILES, f"expected at most {BENCH_MAX_FILES} tracked files under bench/, got {count}"
    assert total <= BENCH_MAX_BYTES, (
        f"expected at most {BENCH_MAX_BYTES} bytes under bench/, got {total}; largest: "
        + ", ".join(f"{name} {sizes[name]}" for name in largest)
    )


def test_no_docs_page_over_15_kb():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, f"expected docs/*.md under {ROOT}"
    over = {p.name: p.stat().st_size for p in pages if p.stat().st_size > DOC_MAX_BYTES}
    assert not over, f"expected every docs/*.md at most {DOC_MAX_BYTES} bytes, got {over}"


def test_package_comments_name_no_run_of_the_record():
    hits = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if RUN_REF.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, f"expected no 'run N' reference in {', '.join(PACKAGE_FOLDERS)}; got {len(hits)}:\n" + "\n".join(
        hits
    )
