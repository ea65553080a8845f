"""Experiment: where the time of one decode step goes at real routing, per kernel, and what moves it.

For EP8 and TP8 at a few batch sizes (sglang_glm5.bench_real routing), times the op from a CUDA graph
(per call, over 16 routings) and, under the torch profiler, each kernel's device time, for variants:
the defaults; other programs per SM (how far the K loop is split); a few explicit tiles.
Usage: python bench/exp/decode_breakdown.py OUT_DIR
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_glm5 import bench_real, moe
from sglang_glm5.testing import random_layer
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a16_plan

CASES = [("ep8", 1), ("ep8", 4), ("ep8", 16), ("ep8", 64), ("tp8", 1), ("tp8", 16)]


def cfg(g1: str, g2: str) -> MoeConfig:
    return MoeConfig(GemmConfig.from_label(g1), GemmConfig.from_label(g2))


VARIANTS = {
    "default": {},
    "pps1": {"PROGRAMS_PER_SM": 1},
    "pps4": {"PROGRAMS_PER_SM": 4},
    "pps8": {"PROGRAMS_PER_SM": 8},
    "16x64x256-s2": {"config": cfg("16x64x256-w4-s2", "16x64x256-w4-s2")},
    "16x64x256-s3": {"config": cfg("16x64x256-w4-s3", "16x64x256-w4-s3")},
    "16x64x256-s3-pps4": {"config": cfg("16x64x256-w4-s3", "16x64x256-w4-s3"), "PROGRAMS_PER_SM": 4},
    "16x128x256-s2": {"config": cfg("16x128x256-w4-s2", "16x128x256-w4-s2")},
    "16x128x256-w8-s3": {"config": cfg("16x128x256-w8-s3", "16x128x256-w8-s3")},
    "16x64x128-s2": {"config": cfg("16x64x128-w4-s2", "16x64x128-w4-s2")},
    "16x64x512-s2": {"config": cfg("16x64x512-w4-s2", "16x64x512-w4-s2")},
}


def main(out: Path) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    bw = bench_real.copy_bandwidth()
    layers = {}
    results = []
    defaults = {"PROGRAMS_PER_SM": w4a16_plan.PROGRAMS_PER_SM}
    for name, batch in CASES:
        layout = bench_real.LAYOUTS[name]
        if name not in layers:
            layers.clear()
            layers[name] = [
                random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda") for _ in range(2)
            ]
        pair = layers[name]
        inputs = []
        for _ in range(16):
            w, ids = bench_real.real_routing(batch, layout, gen)
            inputs.append((torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16(), w, ids))
        touched = sum(int(torch.unique(i[i >= 0]).numel()) for _, _, i in inputs) / 16
        floor = touched * layout.expert_bytes / bw * 1e3
        for variant, settings in VARIANTS.items():
            for k, v in defaults.items():
                setattr(w4a16_plan, k, settings.get(k, v))
            kw = {"check_ids": False, "num_global_experts": 256}
            if "config" in settings:
                kw["config"] = settings["config"]

            def call(inputs=inputs, kw=kw, pair=pair):
                for i, (x, w, ids) in enumerate(inputs):
                    moe.nvfp4_fused_moe(x, *pair[i % 2].args(), w, ids, **kw)

            try:
                ms = bench_real._time(call, True, 16)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                kernels = defaultdict(float)
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        kernels[e.name.split("(")[0][:40]] += e.device_time / 48 / 1000  # ms per call
            except Exception as e:  # noqa: BLE001 - an experiment row that fails is reported and skipped
                print(f"{name} B={batch} {variant}: failed: {e}", flush=True)
                continue
            row = {"layout": name, "batch": batch, "variant": variant, "ms": ms, "floor": floor, "kernels": kernels}
            results.append(row)
            parts = " ".join(f"{k}={v * 1e3:.1f}us" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]))
            print(
                f"{name} B={batch:4d} {variant:14s} {ms * 1e3:7.1f} us  floor {floor * 1e3:5.1f} us | {parts}",
                flush=True,
            )
    for k, v in defaults.items():
        setattr(moe, k, v)
    (out / "decode_breakdown.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
