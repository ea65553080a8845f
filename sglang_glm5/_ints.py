"""Integer helpers for the op's host code.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton language functions (``jit`` / ``constexpr_function``):
called from Python each goes through Triton's wrapper, about 2 us a call on Triton 3.8 and more on 3.6, where the
op computes a few dozen per call, which an eager call's host time pays. These are the same integer arithmetic in
plain Python.
"""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0 (as ``triton.cdiv``)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as ``triton.next_power_of_2`` for n >= 1."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
