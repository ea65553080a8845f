"""Model: what issue 15's lines at GLM-5 B = 1-16 ask of a fixed part and of a part per touched byte.

Reads a recorded ``decode_cases.compare_variants`` JSON (the op at real routing from CUDA graphs, each kernel's device
time, the touched-experts floor, per B) and fits, per layout over B up to each bound, the least-squares line
t = a + b * floor of the op and of each kernel: ``a`` is the part of a step that does not grow with the experts it
touches, ``1 / b`` the rate at which an added byte is decoded, as a share of the copy bandwidth the floor was
measured with. Then, per B, the line (the larger of 20 us and floor / 0.6) and the fixed part that would still meet
it were every added byte decoded at RATE of the copy bandwidth (default 0.80: the two GEMMs together with their
weights already in L2, run 38). A model from measurements, not a measurement: it runs on any machine, no GPU.
Usage: python bench/exp/line_model.py RUN.json [VARIANT] [RATE]
  e.g. python bench/exp/line_model.py bench/h200/runs/run40_ready_blocks_call1.json "whole gemm1"
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

BOUNDS = (4, 16)


def line_us(floor_us: float) -> float:
    """Issue 15's line at B = 1-16 for a step of this touched-experts floor: the larger of 20 us and floor / 0.6."""
    return max(20.0, floor_us / 0.6)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x; b = 0 where every x is the same."""
    xs, ys = zip(*points, strict=True)
    if len(set(xs)) < 2:
        return sum(ys) / len(ys), 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    rows = json.loads(Path(argv[0]).read_text())
    variant = argv[1] if len(argv) > 1 else next(iter(rows[0]["ms"]))
    rate = float(argv[2]) if len(argv) > 2 else 0.80
    by_layout = defaultdict(list)
    for r in rows:
        ms = sorted(r["ms"][variant])
        by_layout[r["layout"]].append(
            (r["batch"], r["floor_ms"] * 1e3, ms[len(ms) // 2] * 1e3, r["kernels_us"][variant])
        )
    print(f"variant {variant!r}; fits t = a + b * floor in us, the added byte's rate = 1 / b of the copy bandwidth")
    for layout, cases in by_layout.items():
        cases.sort()
        for bound in BOUNDS:
            sel = [c for c in cases if c[0] <= bound]
            if len({c[1] for c in sel}) < 2:
                continue
            a, b = fit([(f, t) for _, f, t, _ in sel])
            kernels = " ".join(f"{k} {ka:.1f} + {kb:.2f}" for k in sorted(sel[0][3])
                               for ka, kb in [fit([(f, ks[k]) for _, f, _, ks in sel])])  # fmt: skip
            print(f"{layout} B <= {bound:2d}: op {a:.1f} + {b:.2f} * floor (an added byte at {1 / b:.0%}) | {kernels}")
        for batch, floor, t, _ in cases:
            line = line_us(floor)
            print(f"  {layout} B = {batch:2d}: floor {floor:5.1f}, op {t:5.1f}, line {line:5.1f} us; at {rate:.0%} for "
                  f"every added byte the line leaves {line - floor / rate:5.1f} us for the fixed part")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
