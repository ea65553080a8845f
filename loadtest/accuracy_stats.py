"""The figures of the accuracy A/B: KL divergence over top-k support, and intervals for accuracies.

KL over top-k support. A server returns, at each prompt position, only its k most likely tokens and
their log-probabilities. For a position with baseline list P and patched list Q, let C be the tokens
in both lists. Both distributions are coarsened to the |C| + 1 outcomes "token c" (c in C) and
"any other token" (the tail: everything outside C, whose mass is 1 - sum over C, known exactly for
each side), and

    KL(P || Q) = sum_{c in C} p_c (log p_c - log q_c) + p_tail (log p_tail - log q_tail)

That value is exact for the coarsened distributions, and never more than the full-vocabulary KL
(coarsening can only lose information). Tail masses are clamped to [0, 1] (rounding in the server's
log-softmax can push 1 - sum a hair below 0); q_tail is floored at TAIL_FLOOR so that a tail the
patched server declares empty gives a large finite term, not infinity; a position whose result is
below 0 by rounding counts as 0. Identical lists give exactly 0.

Top-1 agreement: the most likely token of both lists is the same token.

Accuracy: Wilson score interval for each server's proportion correct; the difference (patched -
baseline) over the problems both answered gets Newcombe's interval for paired proportions (method
10 of Newcombe 1998, "Improved confidence intervals for the difference between binomial proportions
based on paired data", without continuity correction): the same problems were asked of both, and
pairing makes the interval narrower than treating the two servers as independent samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
TAIL_FLOOR = 1e-10

TopList = Sequence[tuple[int, float]]  # (token id, logprob), as returned by the server


def position_kl(p_top: TopList, q_top: TopList) -> float:
    """KL(P || Q) at one position, over the tokens both lists hold plus one tail bucket (see module doc)."""
    p = {int(t): float(lp) for t, lp in p_top}
    q = {int(t): float(lp) for t, lp in q_top}
    common = p.keys() & q.keys()
    kl = 0.0
    p_mass = q_mass = 0.0
    for t in common:
        pt = math.exp(p[t])
        kl += pt * (p[t] - q[t])
        p_mass += pt
        q_mass += math.exp(q[t])
    p_tail = min(max(1.0 - p_mass, 0.0), 1.0)
    q_tail = min(max(1.0 - q_mass, TAIL_FLOOR), 1.0)
    if p_tail > 0.0:
        kl += p_tail * (math.log(p_tail) - math.log(q_tail))
    return max(kl, 0.0)


def top1(top: TopList) -> int:
    """The most likely token of a list (the first of equals, in the server's order)."""
    best_id, best_lp = top[0]
    for t, lp in top[1:]:
        if lp > best_lp:
            best_id, best_lp = t, lp
    return int(best_id)


def percentile(values: Sequence[float], p: float) -> float:
    """``metrics.percentile`` of unsorted values (linear interpolation, numpy's default); NaN for none."""
    from sglang_glm5.loadtest.metrics import percentile as sorted_percentile

    return sorted_percentile(sorted(values), p)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (nan, nan) for n = 0."""
    if n <= 0:
        return math.nan, math.nan
    p = k / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def paired_difference(both: int, base_only: int, patched_only: int, neither: int, z: float = Z95) -> dict[str, float]:
    """Patched minus baseline accuracy over paired outcomes, with Newcombe's paired interval (method 10).

    both: problems both servers got right; base_only: only the baseline; patched_only: only the
    patched server; neither: both wrong.
    """
    n = both + base_only + patched_only + neither
    if n == 0:
        return {"diff": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    p_base, p_patched = (both + base_only) / n, (both + patched_only) / n
    lb, ub = wilson(both + base_only, n, z)
    lp, up = wilson(both + patched_only, n, z)
    marginals = (both + base_only) * (patched_only + neither) * (both + patched_only) * (base_only + neither)
    phi = (both * neither - base_only * patched_only) / math.sqrt(marginals) if marginals > 0 else 0.0
    d = p_patched - p_base
    # Newcombe's formula for theta = p1 - p2, with p1 = patched, p2 = baseline.
    delta = math.sqrt(max((p_patched - lp) ** 2 - 2 * phi * (p_patched - lp) * (ub - p_base) + (ub - p_base) ** 2, 0))
    eps = math.sqrt(max((up - p_patched) ** 2 - 2 * phi * (up - p_patched) * (p_base - lb) + (p_base - lb) ** 2, 0))
    return {"diff": d, "low": max(-1.0, d - delta), "high": min(1.0, d + eps), "n": n}
