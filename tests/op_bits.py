"""sha256 of the W4A16 op's output bytes on seeded real-routing cases, through the Triton interpreter on the CPU.

    python tests/op_bits.py                      # the op of the sglang_glm5 that is importable (this tree)
    python tests/op_bits.py --tree /path/to/old  # the op of another checkout (its kernels/ as sglang_glm5.kernels)
    python tests/op_bits.py --write F.json       # also store {case: digest} in F.json

The cases are GLM-5's decode layouts scaled down so that the interpreter runs each in seconds (TP8: a minute): EP8 (8
local of 64 global experts, top-8, I in 5 K steps so that gemm2 walks one N tile a program) and TP8 (every expert
local, I in one K step: gemm2 walks several N tiles a program), at steps of 1 token (one expert active), a few, and
enough that every local expert is busy, with the op's own tiles and with tiles that choose the other plans (stream-K
gemm1, a fixed K split, two routings). Each case calls the op twice (an eager call runs the chains on its shape's
first call and one chain after) and hashes both outputs. ``tests/data/op_bits.json`` holds the digests of 00e4ba9 (the
op before its plan became a settings object), made by ``python tests/op_bits.py --tree <a checkout of 00e4ba9> --write
tests/data/op_bits.json``; ``tests/test_op_bits.py`` checks a sample of them against this tree, this script all.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported


@dataclass(frozen=True)
class Case:
    layout: str  # "ep8" or "tp8"
    batch: int  # tokens in the step
    tiles: str  # "op" (the op's own pick) or a name from TILES
    seed: int

    @property
    def name(self) -> str:
        return f"{self.layout}-b{self.batch}-{self.tiles}"


# (local experts, global experts, hidden, inter)
LAYOUTS = {"ep8": (8, 64, 512, 1280), "tp8": (64, 64, 512, 256)}
TOP_K = 8
# GLM-5 decode at 1/8 .. 8 tokens per expert over 64 global experts: B = 1 one expert active (EP8; TP8: each pair a
# block), B = 4 a few (the chains' span), B = 8 every local expert busy (gemm2 in gemm1's last wave up to B = 64)
BATCHES = (1, 2, 4, 8, 16, 64)
TILE_BATCHES = (2, 16)
CASES = tuple(
    [Case(layout, b, "op", 1000 + i) for i, (layout, b) in enumerate((lo, b) for lo in LAYOUTS for b in BATCHES)]
    + [Case(layout, b, t, 2000 + i) for i, (layout, b, t) in
       enumerate((lo, b, t) for lo in LAYOUTS for b in TILE_BATCHES for t in ("stream", "split3", "two_routings"))]
)  # fmt: skip


def _tiles(name: str):
    from sglang_glm5.tiles import GemmConfig, MoeConfig

    tile = GemmConfig(16, 64, 256, num_warps=4, num_stages=3)
    if name == "stream":  # gemm1 as a stream-K schedule of 2 programs an SM
        return MoeConfig(GemmConfig(16, 64, 256, num_warps=4, num_stages=3, stream=2), tile)
    if name == "split3":  # both GEMMs split K in 3 where they split
        fixed = GemmConfig(16, 64, 128, num_warps=4, num_stages=3, split_k=3)
        return MoeConfig(fixed, fixed)
    if name == "two_routings":  # gemm2 on routing blocks of another block_m than gemm1's
        return MoeConfig(tile, GemmConfig(32, 64, 128, num_warps=4, num_stages=3))
    raise ValueError(f"tiles: expected op, stream, split3 or two_routings, got {name!r}")


def digest(case: Case) -> str:
    import torch

    from sglang_glm5.bench_real import Layout, real_routing
    from sglang_glm5.moe import fused_moe
    from sglang_glm5.testing import random_layer
    from sglang_glm5.weights import Nvfp4MoeWeights

    local, global_experts, hidden, inter = LAYOUTS[case.layout]
    gen = torch.Generator().manual_seed(case.seed)
    layer = random_layer(local, hidden, inter, gen)
    weights = Nvfp4MoeWeights.build(*layer.args())
    x = torch.randn(case.batch, hidden, generator=gen).bfloat16()
    topk_weights, ids = real_routing(case.batch, Layout(case.layout, local, hidden, inter, 0), gen,
                                     global_experts=global_experts, top_k=TOP_K)  # fmt: skip
    config = None if case.tiles == "op" else _tiles(case.tiles)
    sha = hashlib.sha256()
    for _ in range(2):
        out = fused_moe(x, weights, topk_weights, ids, config=config, check_ids=False,
                        num_global_experts=global_experts)  # fmt: skip
        sha.update(out.view(torch.int16).numpy().tobytes())
    return sha.hexdigest()


_MAPPED = ("kernels", "patches", "loadtest", "configs")


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Maps sglang_glm5.{kernels, patches, loadtest, configs} to the folders of ``tree`` (setuptools' package-dir),
    ahead of the editable install's finder, which maps them into the installed tree."""

    def __init__(self, tree: Path):
        self.tree = tree

    def find_spec(self, fullname, path, target=None):
        parts = fullname.split(".")
        if len(parts) != 2 or parts[0] != "sglang_glm5" or parts[1] not in _MAPPED:
            return None
        folder = self.tree / parts[1]
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])  # fmt: skip


def use_tree(tree: Path) -> None:
    """Import ``sglang_glm5`` from ``tree`` rather than from the installed package; checks that it did."""
    tree = tree.resolve()
    sys.path.insert(0, str(tree))
    sys.meta_path.insert(0, _TreeFinder(tree))
    import sglang_glm5.kernels.nvfp4_moe as kernel
    import sglang_glm5.moe as moe

    for module in (moe, kernel):
        if not Path(module.__file__).resolve().is_relative_to(tree):
            raise RuntimeError(f"--tree: expected {module.__name__} from {tree}, got {module.__file__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="a checkout whose sglang_glm5 to run (default: the importable one)")
    parser.add_argument("--write", type=Path, help="store {case: sha256} in this JSON file")
    parser.add_argument("--check", type=Path, help="compare with the digests in this JSON (exit 1 on a difference)")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    if args.tree:
        use_tree(args.tree)
    import sglang_glm5.moe

    print(f"sglang_glm5 from {Path(sglang_glm5.moe.__file__).parent}", flush=True)
    found = {}
    for case in CASES:
        if args.k in case.name:
            found[case.name] = digest(case)
            print(f"{case.name:24s} {found[case.name]}", flush=True)
    if args.write:
        args.write.write_text(json.dumps({c.name: found[c.name] for c in CASES if c.name in found}, indent=1) + "\n")
    if args.check:
        want = json.loads(args.check.read_text())
        differ = [name for name, digest in found.items() if want.get(name) != digest]
        print(f"{len(found) - len(differ)} of {len(found)} cases give the bits of {args.check}; differ: {differ}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
