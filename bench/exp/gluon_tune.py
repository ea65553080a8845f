"""Experiment: ``tune --splits-only`` with other Gluon tiles offered, into the user cache.

The tuner offers ``w4a16_gluon.TILES[kernel]`` on sm_90 up to ``w4a16_plan.GLUON_MAX_BUCKET`` tokens per expert; this
sets them (and the bucket) for this process only, then tunes the named GEMMs of each shape at each batch size (the other
GEMM's entries stay).
Usage: python bench/exp/gluon_tune.py OUT_DIR
  GLUON_GEMM1, GLUON_GEMM2: comma-separated Gluon tile labels (default: the shipped TILES), GLUON_BUCKET (default
  GLUON_MAX_BUCKET), TUNE_KERNELS (default gemm1,gemm2), TUNE_SHAPES (default glm5-ep8,glm5-tp8), TUNE_BATCHES.
"""

import os
import sys
from fractions import Fraction

from sglang_glm5 import cli
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16_gluon, w4a16_plan

SHAPES = os.environ.get("TUNE_SHAPES", "glm5-ep8,glm5-tp8").split(",")
BATCHES = os.environ.get("TUNE_BATCHES", ",".join([f"{b}/32" for b in range(1, 17)] + ["1", "2", "4", "8"]))


def tiles(name: str) -> tuple[GemmConfig, ...]:
    labels = os.environ.get(f"GLUON_{name.upper()}")
    if labels is None:
        return w4a16_gluon.TILES[name]
    return tuple(GemmConfig.from_label(label) for label in labels.split(",") if label)


if __name__ == "__main__":
    w4a16_gluon.TILES.update({name: tiles(name) for name in ("gemm1", "gemm2")})
    w4a16_plan.GLUON_MAX_BUCKET = Fraction(os.environ.get("GLUON_BUCKET", str(w4a16_plan.GLUON_MAX_BUCKET)))
    print("Gluon tiles:", {k: [t.label for t in v] for k, v in w4a16_gluon.TILES.items()},
          "up to", w4a16_plan.GLUON_MAX_BUCKET, "tokens per expert", flush=True)  # fmt: skip
    rc = 0
    for shape in SHAPES:
        args = ["tune", "--target", "local", "--shape", shape, "--batch-sizes", BATCHES, "--splits-only"]
        rc |= cli.main(args + ["--kernels", os.environ.get("TUNE_KERNELS", "gemm1,gemm2")])
    sys.exit(rc)
