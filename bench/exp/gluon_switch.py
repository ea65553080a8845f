"""The op as shipped against the op with ``SGLANG_GLM5_GLUON_GEMM1=1`` (the Gluon gemm1 at decode sizes on sm_90),
at real routing, CUDA graphs over the case's routings, round-robin (``decode_cases.compare_variants``):

    EXP_BATCHES=1,2,4,8 STEPS=exp EXP=bench/exp/gluon_switch.py bash bench/device_run.sh
"""

import os
import sys
from pathlib import Path

from decode_cases import compare_variants

NAME = "SGLANG_GLM5_GLUON_GEMM1"


def main(out: Path) -> None:
    batches = [int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8").split(",")]
    variants = {"off": lambda: os.environ.update({NAME: "0"}), "on": lambda: os.environ.update({NAME: "1"})}
    try:
        compare_variants(out, "gluon_switch", variants, batches, seed=int(os.environ.get("BENCH_SEED", "43")))
    finally:
        os.environ.pop(NAME, None)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
