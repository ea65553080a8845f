"""The whole op at decode sizes with gemm1 replaced by the Gluon form of ``gluon_gemm1.py``, against the op as shipped.

The replacement takes every gemm1 launch of the op: BLOCK_M 16, 64 weight rows, BLOCK_K 256, 3 stages, one quarter's
wgmmas in flight, padding rows not read, a program per possible routing block, K split for ``PPS`` programs per SM
by the op's estimate of the blocks, with or without programmatic dependent launch (without, gemm2's wait covers
all of gemm1). Real
routing, CUDA graphs over the case's routings, round-robin (``decode_cases.compare_variants``):

    STEPS=exp EXP=bench/exp/gluon_op.py bash bench/device_run.sh
"""

import math
import os
import sys
from pathlib import Path

import torch
import triton
from decode_cases import compare_variants
from gluon_gemm1 import launch

from sglang_glm5 import bench_real
from sglang_glm5.variants import w4a16

_shipped = w4a16.launch_gemm1
_counters: dict = {}


def gluon_gemm1(pps: int, pdl: bool = False):
    """A stand-in for ``w4a16.launch_gemm1`` (same arguments) that launches the Gluon gemm1, with programmatic
    dependent launch where the op asks for it if ``pdl``."""

    def launch_gemm1(x, w13, w13_scale, gs13, route, h, cfg, top_k, gate_row0, up_row0, interpret, **kwargs):
        num_pairs, inter = h.shape
        blocks = route.block_expert.numel()
        tiles = triton.cdiv(inter, 64)
        expected = w4a16.expected_blocks(num_pairs, w13.shape[0], bench_real.GLOBAL_EXPERTS, 16)
        sms = w4a16.sm_count(h.device.index)
        want = math.ceil(pps * sms / (max(1.0, expected) * tiles))
        splits, _ = w4a16.k_splits(x.shape[1], 256, want)
        key = (h.device, blocks * tiles)
        if key not in _counters:  # zero once; the kernel leaves it zero
            _counters[key] = torch.zeros(blocks * tiles, dtype=torch.int32, device=h.device)
        part = torch.empty((splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device) if splits > 1 else h
        launch(x, w13, w13_scale, gs13, route, h, top_k, gate_row0, up_row0, 64, 256, 3, 1, False, True, 4, splits,
               (part, _counters[key]), pdl and kwargs.get("pdl", False))  # fmt: skip

    return launch_gemm1


def main(out: Path) -> None:
    batches = [int(b) for b in os.environ.get("EXP_BATCHES", "1,2,3,4,6,8,12,16").split(",")]
    variants = {
        "op": lambda: setattr(w4a16, "launch_gemm1", _shipped),
        "gluon-pps1": lambda: setattr(w4a16, "launch_gemm1", gluon_gemm1(1)),
        "gluon-pps2": lambda: setattr(w4a16, "launch_gemm1", gluon_gemm1(2)),
        "gluon-pps1-pdl": lambda: setattr(w4a16, "launch_gemm1", gluon_gemm1(1, True)),
        "gluon-pps2-pdl": lambda: setattr(w4a16, "launch_gemm1", gluon_gemm1(2, True)),
    }
    try:
        compare_variants(out, "gluon_op", variants, batches, seed=int(os.environ.get("BENCH_SEED", "43")))
    finally:
        w4a16.launch_gemm1 = _shipped


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
