"""Experiment: does DRAM care how a decode GEMM's weight tile lies in memory?

A decode GEMM program reads, each K step of 256 codes, 128 bytes from each of BLOCK_N weight rows; the rows are one
expert's K / 2 bytes long (gemm1, GLM-5 EP8: 3072 B; gemm2: 1024 B), so a step touches BLOCK_N pieces of 128 B a row
length apart. Plain reads of the same experts' bytes in contiguous chunks reach 88-103% of the copy bandwidth (run 41),
the GEMMs 70-82% from DRAM against 85-91% with every byte in L2 (runs 38-42). This reads exactly the GEMMs' pieces in
their order, persistent programs over (expert, N tile) tiles as the GEMMs' programs walk them, with a K step's loads
(and ``AHEAD`` steps more) in flight, in two layouts of the same bytes:

- ``rows``: the checkpoint's (and the kernel layout's) row-major [E, N, K / 2]: a step is BLOCK_N strided pieces;
- ``blocked``: each (tile, K step) of BLOCK_N x 128 B stored contiguously ([E, N / BLOCK_N, K / 256, BLOCK_N, 128]).

and beside them the same byte count read as plain contiguous chunks (``flat``). If ``blocked`` reads markedly faster
than ``rows``, a weight layout blocked by tile would raise the GEMMs' ceiling from DRAM; if not, the layout is not
what holds them under the plain reads. ``rows, streamed`` (one step ahead) reads the row-major pieces with the window
running on from one tile into the next, as a GEMM that prefetches its next tile's first step would: what a tile's
refill costs.
Usage: python bench/exp/read_pattern.py OUT_DIR   (BENCH_SEED, default 43; EXP_MATRICES, default w13,w2)
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from sglang_glm5 import bench_real

STEP_BYTES = 128  # a K step of 256 codes in one row
# (name, rows, row bytes, BLOCK_N): GLM-5 EP8's w13 (gate and up rows, K = 6144) and w2 (K = 2048), 32 experts
MATRICES = (("w13", 32 * 4096, 3072), ("w2", 32 * 6144, 1024))
BLOCK_NS = (64, 128)
# (programs a SM, K steps in flight beyond the current one): the GEMMs run 2-4 programs a SM with 1-2 steps ahead
SCHEDULES = ((2, 2), (4, 1), (4, 2), (8, 1))  # AHEAD is 1 or 2


@triton.jit
def tile_read_kernel(
    w_ptr,  # int32, the matrix's bytes in the layout BLOCKED names
    out_ptr,  # [programs] int32, each program's sum of what it read
    num_tiles,  # (expert, N tile) tiles: rows / BLOCK_N
    K_STEPS: tl.constexpr,  # row bytes / 128
    BLOCK_N: tl.constexpr,
    AHEAD: tl.constexpr,  # 1 or 2: K steps loaded before the current one is added
    BLOCKED: tl.constexpr,  # True: each (tile, K step) is BLOCK_N x 128 B contiguous; False: rows of K_STEPS x 128 B
    STREAM: tl.constexpr = False,  # True: the window runs on across the program's tiles (no refill at a tile's start)
):
    WORDS: tl.constexpr = 32  # int32 words in 128 B
    rows = tl.arange(0, BLOCK_N)[:, None]
    words = tl.arange(0, WORDS)[None, :]
    if BLOCKED:
        within = rows * WORDS + words
        step_stride = BLOCK_N * WORDS
    else:
        within = rows * (K_STEPS * WORDS) + words
        step_stride = WORDS
    tile_stride = BLOCK_N * K_STEPS * WORDS  # the same in both layouts: a tile is BLOCK_N whole rows
    acc = tl.zeros((BLOCK_N, WORDS), dtype=tl.int32)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if STREAM:
        # One loop over the program's (tile, K step) units; unit i is K step i % K_STEPS of its (i // K_STEPS)-th tile.
        units = (num_tiles - pid + programs - 1) // programs * K_STEPS
        a = tl.load(_unit(w_ptr, within, 0, pid, programs, K_STEPS, tile_stride, step_stride), mask=units > 0,
                    other=0, cache_modifier=".cg")  # fmt: skip
        for i in range(1, units):
            nxt = tl.load(
                _unit(w_ptr, within, i, pid, programs, K_STEPS, tile_stride, step_stride), cache_modifier=".cg"
            )
            acc += a
            a = nxt
        acc += a
    else:
        for tile in range(pid, num_tiles, programs):
            base = w_ptr + tile.to(tl.int64) * tile_stride + within
            # A rolling window in registers: step s is loaded AHEAD steps before it is added.
            a = tl.load(base, cache_modifier=".cg")
            if AHEAD == 2:
                b = tl.load(base + step_stride, cache_modifier=".cg")
            for s in range(AHEAD, K_STEPS):
                nxt = tl.load(base + s * step_stride, cache_modifier=".cg")
                acc += a
                if AHEAD == 2:
                    a = b
                    b = nxt
                else:
                    a = nxt
            acc += a
            if AHEAD == 2:
                acc += b
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _unit(w_ptr, within, i, pid, programs, K_STEPS: tl.constexpr, tile_stride, step_stride):
    """The addresses of a program's unit i: K step i % K_STEPS of its tile pid + (i // K_STEPS) * programs."""
    tile = pid + (i // K_STEPS) * programs
    return w_ptr + tile.to(tl.int64) * tile_stride + (i % K_STEPS) * step_stride + within


def blocked(w: torch.Tensor, row_bytes: int, block_n: int) -> torch.Tensor:
    """``w`` ([rows * row_bytes / 4] int32, row-major) with each (tile, K step) of block_n x 128 B made contiguous."""
    steps = row_bytes // STEP_BYTES
    return w.view(-1, block_n, steps, STEP_BYTES // 4).transpose(1, 2).contiguous().view(-1)


def read_setup() -> tuple[torch.Generator, float, int, str]:
    """(seeded CUDA generator, copy bandwidth in bytes/s, SMs, GPU name) of a read experiment, printed."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(os.environ.get("BENCH_SEED", "43")))
    bw = bench_real.copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s, triton {triton.__version__}", flush=True)
    return gen, bw, sms, gpu


def main(out_dir: Path) -> None:
    gen, bw, sms, _ = read_setup()
    sink = torch.empty(8 * sms, dtype=torch.int32, device="cuda")
    rows_out = []
    for name, rows, row_bytes in (m for m in MATRICES if m[0] in os.environ.get("EXP_MATRICES", "w13,w2").split(",")):
        nbytes = rows * row_bytes
        w = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), generator=gen, device="cuda", dtype=torch.int32)
        for block_n in BLOCK_NS:
            wb = blocked(w, row_bytes, block_n)
            for per_sm, ahead in SCHEDULES:
                programs = per_sm * sms
                launches = {}
                forms = [("rows", w, False, False), ("blocked", wb, True, False)]
                if ahead == 1:
                    forms.append(("rows, streamed", w, False, True))
                for label, data, is_blocked, stream in forms:

                    def launch(data=data, is_blocked=is_blocked, stream=stream, programs=programs, ahead=ahead,
                               tiles=rows // block_n, steps=row_bytes // STEP_BYTES, block_n=block_n):  # fmt: skip
                        tile_read_kernel[(programs,)](data, sink, tiles, K_STEPS=steps, BLOCK_N=block_n, AHEAD=ahead,
                                                      BLOCKED=is_blocked, STREAM=stream, num_warps=4)  # fmt: skip

                    launches[label] = launch
                # A program reads whole tiles, and a tile is the same bytes in both layouts: its sums must agree.
                sums = []
                for fn in launches.values():
                    fn()
                    sums.append(sink[:programs].clone())
                assert all(torch.equal(sums[0], other) for other in sums[1:]), f"{name} {block_n}: the sums differ"
                times = {}
                for _ in range(3):  # alternate the layouts; keep each one's median over the rounds
                    for label, fn in launches.items():
                        times.setdefault(label, []).append(bench_real._time(fn, True, 1) * 1e3)
                med = {k: sorted(v)[1] for k, v in times.items()}
                floor = nbytes / bw * 1e6
                rows_out.append({"matrix": name, "block_n": block_n, "programs_per_sm": per_sm, "ahead": ahead,
                                 "bytes": nbytes, "floor_us": floor, "us": med, "us_all": times})  # fmt: skip
                cells = " | ".join(f"{k} {v:7.1f} us ({floor / v:.0%} of copy bw)" for k, v in med.items())
                print(f"{name} BLOCK_N {block_n:3d}, {per_sm} a SM, {ahead} ahead: {cells} | blocked / rows "
                      f"{med['blocked'] / med['rows']:.3f}", flush=True)  # fmt: skip
        flat = w.view(-1)
        out = torch.empty((), dtype=torch.int32, device="cuda")
        t = bench_real._time(lambda flat=flat, out=out: torch.sum(flat, 0, dtype=torch.int32, out=out), True, 1) * 1e3
        print(f"{name} torch.sum over the same bytes (contiguous): {t:7.1f} us ({nbytes / bw * 1e6 / t:.0%})")
        rows_out.append({"matrix": name, "flat_sum_us": t, "bytes": nbytes})
        (out_dir / "read_pattern.json").write_text(json.dumps({"copy_bandwidth": bw, "rows": rows_out}, indent=1))
        del w, wb


if __name__ == "__main__":
    main(Path(sys.argv[1]))
