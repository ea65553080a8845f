"""Search: the fewest integer operations that decode a 32-bit register of 8 e2m1 codes (two 16-bit words of 4) into
four bf16 pairs, over every placement of a word's 16 bits, with code positions sharing shifts.

A code's magnitude (mantissa, exponent low, exponent high) must land at bits 6, 7, 8 and its sign at 15 of each
16-bit lane (``kernels/nvfp4_moe.decode_ptx``). One shift of the register (left or right) moves both lanes; an and
(or a lop3 adding to what is there) keeps the bits of one shift. So a code costs one and / lop3 per distinct shift
among its bits, and the register costs the distinct nonzero shifts over all codes (the PTX compiler may share an
identical shift across code positions) plus those pieces. Placements with each code's magnitude bits adjacent and in
order (any sign bit); prints the cheapest. ``nvfp4.KERNEL_WORD`` costs 11, the least.
Usage: python bench/exp/word_layout_search.py
"""

import itertools

MAGNITUDE_TARGET, SIGN_TARGET = 6, 15  # bf16: magnitude at bits 6-8, sign at 15


def costs():
    for starts in itertools.combinations(range(14), 4):  # each code's magnitude at bits p, p + 1, p + 2
        taken = [b for p in starts for b in (p, p + 1, p + 2)]
        if len(set(taken)) < 12:
            continue
        rest = [b for b in range(16) if b not in taken]
        for signs in itertools.permutations(rest, 4):
            shifts, pieces = set(), 0
            for p, s in zip(starts, signs, strict=True):
                magnitude, sign = MAGNITUDE_TARGET - p, SIGN_TARGET - s
                pieces += 1 if magnitude == sign else 2
                shifts |= {magnitude, sign}
            shifts.discard(0)
            yield len(shifts) + pieces, starts, signs, sorted(shifts)


if __name__ == "__main__":
    ranked = sorted(costs())
    print(f"{len(ranked)} placements; least {ranked[0][0]} operations, {sum(r[0] == ranked[0][0] for r in ranked)} "
          f"placements reach it")  # fmt: skip
    for cost, starts, signs, shifts in ranked[:5]:
        print(f"  {cost}: magnitudes at {starts}, signs at {signs}, shifts {shifts}")
