"""Ahead-of-time probe (no GPU): the heuristic's candidate tiles at one to eight tokens per expert, compiled as busy
decode launches them (unsplit, a program per block, block axis last, ready counters) for sm_90 and sm_120.

Printed per GEMM, tile and architecture: registers, stack (spills), shared memory, the programs an SM holds by shared
memory (228 KB an SM on sm_90, 100 KB on sm_120, 1 KB reserved a program) and by registers, the K loop's SASS
instructions and those a weight (a warp's loop instructions times the warps, over the weights a K step reads: gemm1's
gate and up rows, 2 x block_n x block_k; gemm2's block_n x block_k): the K step's instruction stream barely outruns
the H200's DRAM (run 43 measured it alone at about 1.1x the copy bandwidth, bench/README.md), so fewer of them a weight
is what a tile can buy there. Compiles only: nothing here ran on an SM120.
Usage: python bench/exp/aot_busy_tiles.py [OUT_DIR]
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"

from aot_load_forms import BIN, k_loop  # noqa: E402

from sglang_glm5.hardware import resolve  # noqa: E402
from sglang_glm5.tiles import GemmConfig  # noqa: E402
from sglang_glm5.variants import w4a16_tiles  # noqa: E402

TILES = ("16x64x128-w4-s3", "16x64x256-w4-s3", "16x64x256-w4-s2")
FORMS = {
    "gemm1": {"SPLITS": 1, "BLOCK_LOOP": False, "READY": True, "BLOCKS_LAST": True},
    "gemm2": {"MULTI_TILE": False, "SPLITS": 1, "BLOCK_LOOP": False, "READY": True, "BLOCKS_LAST": True},
}
REGISTERS_PER_SM = 65536
ROWS = {"gemm1": 2, "gemm2": 1}  # weight rows a K step reads per row of the tile's block_n (gemm1: gate and up)


def probe(kernel: str, label: str, arch: int, folder: Path) -> dict:
    cfg = GemmConfig.from_label(label)
    k = w4a16_tiles._compile(kernel, cfg, arch, FORMS[kernel])
    cubin = folder / f"{kernel}_{label}_{arch}.cubin"
    cubin.write_bytes(k.asm["cubin"])
    sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    body = k_loop(sass)
    usage = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    regs, stack = (int(re.search(rf"{field}:(\d+)", usage).group(1)) for field in ("REG", "STACK"))
    shared = int(k.metadata.shared)
    threads = 32 * cfg.num_warps
    return {
        "kernel": kernel, "tile": label, "arch": arch, "registers": regs, "stack": stack, "shared": shared,
        "programs_by_shared": resolve(f"sm{arch}").programs_by_shared(shared),
        "programs_by_registers": REGISTERS_PER_SM // (regs * threads),
        "k_loop": len(body),
        "per_weight": round(len(body) * cfg.num_warps / (ROWS[kernel] * cfg.block_n * cfg.block_k), 4),
        "mma": sum(bool(re.search(r"\bH?G?MMA", b)) for b in body),
    }  # fmt: skip


def main(out: Path) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in (90, 120):
            for kernel in FORMS:
                for label in TILES:
                    rows.append(probe(kernel, label, arch, Path(tmp)))
                    print(json.dumps(rows[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    import triton

    (out / "aot_busy_tiles.json").write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
