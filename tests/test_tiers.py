"""The slower tier (tests/tiers.py) stays honest: every entry names a test that exists, and a grid that leaves
cases to the slower tier keeps at least one case in the fast one."""

from pathlib import Path

import pytest
import tiers

TESTS = Path(__file__).resolve().parent


def _whole_suite(collected_ids: list[str]) -> bool:
    files = {nodeid.split("::", 1)[0].rsplit("/", 1)[-1] for nodeid in collected_ids}
    return files >= {path.name for path in TESTS.glob("test_*.py")}


def test_every_entry_names_a_collected_test(collected_ids):
    if not _whole_suite(collected_ids):
        pytest.skip("only a part of the suite was collected")
    stale = [p for p in tiers.EXHAUSTIVE if not any(p in tiers.exhaustive_entries(i) for i in collected_ids)]
    assert not stale, f"entries of tests/tiers.py that name no test: {stale}"


def test_a_grid_keeps_a_fast_case(collected_ids):
    if not _whole_suite(collected_ids):
        pytest.skip("only a part of the suite was collected")
    grids = {p.split("[", 1)[0] for p, why in tiers.EXHAUSTIVE.items() if why == tiers.GRID}
    for grid in grids:
        cases = [i for i in collected_ids if i.split("tests/", 1)[-1].split("[", 1)[0] == grid]
        assert cases, f"{grid}: no such test"
        assert any(not tiers.exhaustive_entries(i) for i in cases), f"{grid}: every case is in the slower tier"


def test_an_entry_matches_ids_with_brackets():
    # fnmatch reads '[' as a character set: the entries spell a literal bracket '[[]'
    grid = "tests/test_ready_blocks.py::test_gemm1_counts_each_blocks_tiles_and_keeps_its_bits"
    assert tiers.exhaustive_entries(f"{grid}[1-1-3]")
    assert not tiers.exhaustive_entries(f"{grid}[1-1-1]")
