"""sha256 of the op's output bytes on the GPU, GLM-5's full EP8 and TP8 layers at real routing.

    PYTHONPATH=<a package laid out as it installs> python3 -P bench/gpu_bits.py OUT.json [--against OTHER.json]

Run once per revision in one call on one GPU (device_run.sh's step ``bits`` runs this tree and ``.base/``): equal
digests mean the revisions compute the same bits. Each case calls the op three times on the same inputs (the first
eager call of a shape may run the two chains, later ones one chain) and hashes each output, so a plan that differs
only on a shape's first call shows too. The CPU counterpart, through the interpreter at scaled-down shapes, is
tests/op_bits.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch

BATCHES = (1, 2, 4, 8, 16, 64, 256, 2048)


def digests(seed: int = 7) -> dict[str, list[str]]:
    from sglang_glm5.bench_real import GLOBAL_EXPERTS, LAYOUTS, real_routing
    from sglang_glm5.moe import fused_moe
    from sglang_glm5.testing import random_layer

    out = {}
    for name, layout in LAYOUTS.items():
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        bundle = random_layer(layout.num_experts, layout.hidden, layout.inter, gen, "cuda").served()
        for batch in BATCHES:
            weights, ids = real_routing(batch, layout, gen)
            x = torch.randn(batch, layout.hidden, generator=gen, device="cuda").bfloat16()
            calls = [fused_moe(x, bundle, weights, ids, check_ids=False, num_global_experts=GLOBAL_EXPERTS)
                     for _ in range(3)]
            torch.cuda.synchronize()
            out[f"{name}-b{batch}"] = [hashlib.sha256(y.contiguous().view(torch.uint8).cpu().numpy()).hexdigest()
                                       for y in calls]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="write {case: [digest per call]} here")
    p.add_argument("--against", help="the digests of another revision: report each case equal or not")
    args = p.parse_args(argv)
    got = digests()
    with open(args.out, "w") as f:
        json.dump(got, f, indent=1)
    if not args.against:
        return 0
    with open(args.against) as f:
        other = json.load(f)
    differ = [case for case in got if got[case] != other.get(case)]
    for case in got:
        print(f"{case:12s} {'same bits' if case not in differ else 'DIFFERENT'}")
    print(f"{len(got) - len(differ)} of {len(got)} cases bit-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
