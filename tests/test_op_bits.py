"""The op's output bits on real-routing cases (``op_bits.py``) against those of 00e4ba9 (``data/op_bits.json``): the
plan as a settings object changes no launch. A sample here (the interpreter takes seconds a case); the whole set with
``python tests/op_bits.py --check tests/data/op_bits.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from op_bits import CASES, digest

from sglang_glm5 import env

STORED = json.loads((Path(__file__).parent / "data" / "op_bits.json").read_text())
# EP8 B = 4: two interleaved chains, split K, each on its share of the SMs; and the chains' first and later eager calls
SAMPLE = ("ep8-b4-op",)


@pytest.mark.skipif(env.get(env.TEST_DEVICE) != "cpu", reason="the stored digests are the interpreter's")
@pytest.mark.parametrize("name", SAMPLE)
def test_the_op_gives_the_stored_bits(name):
    case = next(c for c in CASES if c.name == name)
    assert digest(case) == STORED[name]


def test_every_case_has_a_stored_digest():
    assert {c.name for c in CASES} == set(STORED)
