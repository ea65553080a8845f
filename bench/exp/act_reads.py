"""Experiment: do the decode GEMMs' activation reads slow their weight reads?

At GLM-5 EP8 B = 256 a routing block holds about 8 of its 16 rows, and every N-tile program of a block reads the
block's activations again each K step: gemm1 (16x64 tiles, gate and up: 128 weight rows) reads 8 KB of activations
beside 16 KB of weights a step, gemm2 (16x64 or 16x128 over I = 2048) 8 KB beside 8-16 KB. Those bytes come from the
L2 (the activations are 1-3 MB), not DRAM, but they cross the same L2-to-SM path as the weights: about 0.9 GB of it
a step at EP8 B = 256 for 0.68 GB of weights. Plain reads of the GEMMs' weight pieces reach 88-92% (w13) and 80-81%
(w2) of the copy bandwidth (run 43, ``read_pattern.py``); this reads the same pieces, persistent programs over
(block, N tile) tiles with the block axis slowest (the busy grids' order), with and without each step's activation
rows (``ACT_ROWS`` rows of 512 B, gathered from a [T, K] bf16 tensor by a per-block list of tokens, the other rows of
the 16 masked as the GEMMs mask padding). If the activations cost the weight reads markedly, the L2-to-SM path is a
co-limit at busy decode, and fewer activation bytes a weight byte (wider N tiles, activations shared between a
block's programs) is a lever; if not, it is not.
Usage: python bench/exp/act_reads.py OUT_DIR   (BENCH_SEED, default 43)
"""

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from read_pattern import read_setup

from sglang_glm5 import bench_real

STEP_BYTES = 128  # a K step of 256 codes in one weight row
ACT_STEP_BYTES = 512  # a K step of 256 bf16 activations in one row
TOKENS = 256  # GLM-5 B = 256
BLOCKS = 32  # EP8: 32 experts, about one routing block each at B = 256
# (name, weight rows of one expert, row bytes, the activations' row bytes, weight rows a program)
MATRICES = (
    ("gemm1 16x64 (w13, gate and up)", 4096, 3072, 6144 * 2, 128),
    ("gemm2 16x64 (w2)", 6144, 1024, 2048 * 2, 64),
    ("gemm2 16x128 (w2)", 6144, 1024, 2048 * 2, 128),
)
PROGRAMS_PER_SM = (2, 3, 4)
ACT_ROW_COUNTS = (0, 8, 16)  # activation rows read a step (of the block's 16)


@triton.jit
def act_read_kernel(
    w_ptr,  # int32 [BLOCKS * tiles a block * BLOCK_N * K_STEPS * 32], row-major weight rows
    a_ptr,  # int32 [T, A_WORDS * K_STEPS] activations, row-major
    rows_ptr,  # int32 [BLOCKS, 16] the token of each row of a block
    out_ptr,  # [programs] int32, each program's sum of what it read
    num_tiles,
    tiles_per_block,
    K_STEPS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACT_ROWS: tl.constexpr,  # 0: weights only
):
    WORDS: tl.constexpr = 32  # int32 words in 128 B
    A_WORDS: tl.constexpr = 128  # int32 words in 512 B
    within = tl.arange(0, BLOCK_N)[:, None] * (K_STEPS * WORDS) + tl.arange(0, WORDS)[None, :]
    tile_stride = BLOCK_N * K_STEPS * WORDS
    slot = tl.arange(0, 16)
    acc = tl.zeros((BLOCK_N, WORDS), dtype=tl.int32)
    act_acc = tl.zeros((16, A_WORDS), dtype=tl.int32)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for tile in range(pid, num_tiles, programs):
        base = w_ptr + tile * tile_stride + within  # under 2**31 words for these matrices
        if ACT_ROWS > 0:
            token = tl.load(rows_ptr + (tile // tiles_per_block) * 16 + slot)
            act_base = a_ptr + token.to(tl.int64)[:, None] * (K_STEPS * A_WORDS) + tl.arange(0, A_WORDS)[None, :]
            act_mask = (slot < ACT_ROWS)[:, None]
        a = tl.load(base, cache_modifier=".cg")
        for s in range(1, K_STEPS):
            nxt = tl.load(base + s * WORDS, cache_modifier=".cg")
            if ACT_ROWS > 0:
                act_acc += tl.load(act_base + (s - 1) * A_WORDS, mask=act_mask, other=0, cache_modifier=".cg")
            acc += a
            a = nxt
        acc += a
        if ACT_ROWS > 0:
            act_acc += tl.load(act_base + (K_STEPS - 1) * A_WORDS, mask=act_mask, other=0, cache_modifier=".cg")
    total = tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(tl.sum(act_acc, axis=1), axis=0)
    tl.store(out_ptr + pid, total)


def main(out_dir: Path) -> None:
    gen, bw, sms, gpu = read_setup()
    sink = torch.empty(max(PROGRAMS_PER_SM) * sms, dtype=torch.int32, device="cuda")
    # Each block's 16 rows: distinct random tokens (a token has at most one slot an expert).
    rows = torch.stack([torch.randperm(TOKENS, generator=gen, device="cuda")[:16] for _ in range(BLOCKS)])
    rows = rows.to(torch.int32)
    results = []
    for name, expert_rows, row_bytes, act_row_bytes, block_n in MATRICES:
        nbytes = BLOCKS * expert_rows * row_bytes
        w = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), generator=gen, device="cuda", dtype=torch.int32)
        act = torch.randint(-(2**31), 2**31 - 1, (TOKENS, act_row_bytes // 4), generator=gen, device="cuda",
                            dtype=torch.int32)  # fmt: skip
        k_steps = row_bytes // STEP_BYTES
        assert act_row_bytes // ACT_STEP_BYTES == k_steps, "one activation step a weight step"
        tiles_per_block = expert_rows // block_n
        floor = nbytes / bw * 1e6
        for per_sm in PROGRAMS_PER_SM:
            programs = per_sm * sms
            launches = {}
            for act_rows in ACT_ROW_COUNTS:

                def launch(act_rows=act_rows, programs=programs, w=w, act=act, tiles=tiles_per_block, steps=k_steps,
                           block_n=block_n):  # fmt: skip
                    act_read_kernel[(programs,)](w, act, rows, sink, BLOCKS * tiles, tiles, K_STEPS=steps,
                                                 BLOCK_N=block_n, ACT_ROWS=act_rows, num_warps=4)  # fmt: skip

                launches[act_rows] = launch
            # The weights-only sums are what the kernel read: check one against torch before timing.
            launches[0]()
            expect = w.view(BLOCKS * tiles_per_block, -1).sum(dim=1, dtype=torch.int64)
            per_program = torch.zeros(programs, dtype=torch.int64, device="cuda")
            per_program.index_add_(0, torch.arange(BLOCKS * tiles_per_block, device="cuda") % programs, expect)
            assert torch.equal(sink[:programs].to(torch.int64), ((per_program + 2**31) % 2**32) - 2**31), name
            times = {}
            for _ in range(3):  # alternate the forms; keep each one's median over the rounds
                for act_rows, fn in launches.items():
                    times.setdefault(act_rows, []).append(bench_real._time(fn, True, 1) * 1e3)
            med = {k: sorted(v)[1] for k, v in times.items()}
            act_bytes = {k: BLOCKS * tiles_per_block * k_steps * k * ACT_STEP_BYTES for k in med}
            results.append({"matrix": name, "programs_per_sm": per_sm, "weight_bytes": nbytes, "floor_us": floor,
                            "us": med, "us_all": times, "act_bytes": act_bytes})  # fmt: skip
            cells = " | ".join(
                f"{k:2d} act rows {v:6.1f} us ({floor / v:.0%} of copy bw, {act_bytes[k] / 1e6:4.0f} MB from L2)"
                for k, v in med.items()
            )
            print(f"{name}, {per_sm} a SM: {cells} | 8 / 0 rows {med[8] / med[0]:.3f}, 16 / 0 {med[16] / med[0]:.3f}",
                  flush=True)  # fmt: skip
        record = {"copy_bandwidth": bw, "gpu": gpu, "rows": results}
        (out_dir / "act_reads.json").write_text(json.dumps(record, indent=1))
        del w, act


if __name__ == "__main__":
    main(Path(sys.argv[1]))
