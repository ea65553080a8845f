"""The host code's integer helpers give Triton's answers (they replace calls of triton.cdiv and
triton.next_power_of_2, which are slow to call from Python)."""

import pytest
import triton

from sglang_glm5._ints import cdiv, next_power_of_2

# numerators: zero, one, around powers of two, GLM-5's sizes (6144 = H, 2048 = I, 256 experts), odd ones
NUMERATORS = [0, 1, 2, 15, 16, 17, 255, 256, 257, 727, 2048, 6144, 6145, 65535, 65536, 2**31 + 5]
DENOMINATORS = [1, 2, 3, 16, 64, 128, 256, 577]


@pytest.mark.parametrize("b", DENOMINATORS)
def test_cdiv_is_tritons(b):
    for a in NUMERATORS:
        assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_is_tritons():
    # from 1: at 0 Triton 3.8 answers 0 as a language function and 1 once the interpreter has replaced it (the op
    # asks for at least 1 everywhere)
    for n in [*range(1, 1100), 4095, 4096, 4097, 65537, 2**31 - 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
    assert next_power_of_2(0) == 1
