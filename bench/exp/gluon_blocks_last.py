"""Experiment: the op at chunked-prefill sizes with the Gluon gemm1's grid in either order (``w4a16_gluon.launch``'s
``blocks_last``: a block's N tiles side by side, so its activation rows are read while in L2), the tiles a lookup picks
now, the same routings (bench_real, seed 43), one process; round-robin, the median of ROUNDS.
Usage: python bench/exp/gluon_blocks_last.py OUT_DIR
"""

import functools
import json
import statistics
import sys
from pathlib import Path

from sglang_glm5 import bench_real
from sglang_glm5.variants import w4a16_gluon

BATCHES = (2048, 4096, 8192)
ROUNDS = 3
SHIPPED = w4a16_gluon.launch


def main(out: Path) -> None:
    rows = []
    for name in ("ep8", "tp8"):
        times = {False: [], True: []}
        for _ in range(ROUNDS):
            for order in (False, True):
                w4a16_gluon.launch = functools.partial(SHIPPED, blocks_last=True) if order else SHIPPED
                got = bench_real.run(bench_real.LAYOUTS[name], BATCHES, 43, baselines=False)
                times[order].append([r.ms_ours for r in got])
        w4a16_gluon.launch = SHIPPED
        for i, batch in enumerate(BATCHES):
            first, last = (statistics.median(t[i] for t in times[o]) for o in (False, True))
            rows.append({"layout": name, "batch": batch, "blocks_first_ms": first, "blocks_last_ms": last})
            print(f"{name} B={batch}: blocks first {first:.4f} ms, N tiles first {last:.4f} ms ({last / first:.3f}x)",
                  flush=True)  # fmt: skip
    (out / "gluon_blocks_last.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
