"""Summarize Nsight Compute's SASS source page (CSV, ``ncu --page source --csv --print-source sass``): stall samples
by opcode, and the hottest instructions with their neighbours' opcodes.

python3 bench/exp/ncu_hot.py FILE.csv [TOP]
"""

import csv
import sys
from collections import Counter


def main(path: str, top: int = 30) -> None:
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    lines = lines[next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0) :]
    rows = list(csv.DictReader(lines))
    if not rows:
        print(f"{path}: no rows")
        return
    cols = list(rows[0].keys())
    samples = next((c for c in cols if "Sampling (All" in c), None)
    source = next((c for c in cols if c.strip() == "Source"), None)
    if samples is None or source is None:
        print(f"{path}: columns {cols[:12]}")
        return
    per_reason = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]

    def num(v: str) -> float:
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[samples]) for r in rows)
    by_op = Counter()
    for r in rows:
        by_op[r[source].split()[0] if r[source].split() else "?"] += num(r[samples])
    print(f"{path}: {len(rows)} instructions, {total:.0f} samples")
    print("by opcode:", ", ".join(f"{op} {v / total:.1%}" for op, v in by_op.most_common(14)))
    hot = sorted(range(len(rows)), key=lambda i: -num(rows[i][samples]))[:top]
    for i in sorted(hot):
        r = rows[i]
        reasons = sorted(((num(r[c]), c) for c in per_reason), reverse=True)[:3]
        print(
            f"  {i:5d} {num(r[samples]) / total:6.1%}  {r[source][:60]:60s} "
            + " ".join(f"{c.split('(')[0].strip()[:28]}={v:.0f}" for v, c in reasons if v)
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
