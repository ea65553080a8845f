"""Experiment: what reading a decode step's weights takes on this GPU, with no decode and no math.

The issue's lines at GLM-5 B = 1-4 (0.020 ms at B = 1-2) are set against the touched-experts floor: the experts' NVFP4
bytes at the device copy bandwidth. A step also pays launches and the latency of its first reads. This times plain
reads of exactly the bytes a step touches (n experts' w13 and w2 with their block scales, GLM-5 EP8 shapes), in the
launch shapes the op could take, from CUDA graphs over 16 steps on two copies of the layer (each step other experts,
as bench_real's routings), beside the same bytes' floor:

- ``one launch``: one grid of programs over all n experts' w13 then w2 bytes (SCHEDULES: programs a SM and loads
  in flight a thread, each tried);
- ``two launches``: w13's bytes, then w2's in a second launch (the two GEMMs' launches);
- ``four launches``: two small launches around those (a routing-sized and a sum-sized one, each one program
  reading a few bytes): the op's launch count; ``four launches, PDL`` the same with programmatic dependent launch, as
  the op launches at decode (each kernel waits for the one before it, then lets the next start).

The programs read chunks of every region in turn (chunk u of all the regions' chunks by program u mod programs), in
16-byte vectors with all of a chunk's loads in flight, and each stores one int32 (the sum of what it read), so that
nothing is optimized away. The gap between these times and the op's (one EP8 expert at T = 1: 22.5 us on the H200) is
what decoding, the dots, the split sums and the chains between them cost; what these take beyond the floor is what no
kernel can remove with that many launches.
What it showed: docs/lab.md.
Usage: python bench/exp/read_floor.py OUT_DIR   (BENCH_SEED, default 43; EXP_EXPERTS, default 1,2,3,4,8,16,32)
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from decode_cases import generator
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_glm5 import bench_real

EXPERTS = tuple(int(n) for n in os.environ.get("EXP_EXPERTS", "1,2,3,4,8,16,32").split(","))
# (programs a SM, 16-byte loads in flight a thread): the read's own schedule, tried in turn; the best is its floor
SCHEDULES = ((8, 8), (16, 8), (16, 4))
VEC = 4  # int32 lanes a 16-byte load


@triton.jit
def read_kernel(base_ptr, starts_ptr, num_regions, region_offset, region_size, out_ptr, BLOCK: tl.constexpr,
                UNROLL: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Reads int32 elements [start + region_offset, start + region_offset + region_size) of ``base_ptr`` for each of
    ``num_regions`` starts (int64, multiples of 4: 16-byte vectors) in chunks of BLOCK * UNROLL, chunk u of all the
    regions' chunks (region-major) by program u mod programs, and stores each program's sum of what it read. With PDL,
    as the op's launches: waits for the launch before it to finish, then lets the next one start."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    CHUNK: tl.constexpr = BLOCK * UNROLL
    chunks = tl.cdiv(region_size, CHUNK)
    for u in range(pid, num_regions * chunks, programs):
        start = tl.load(starts_ptr + u // chunks) + region_offset
        begin = start + (u % chunks) * CHUNK
        end = tl.multiple_of(start + tl.minimum((u % chunks + 1) * CHUNK, region_size), 4)
        for k in tl.static_range(UNROLL):
            offs = tl.multiple_of(begin + k * BLOCK, 4) + tl.arange(0, BLOCK)
            acc += tl.load(base_ptr + offs, mask=offs < end, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def launch_read(base, starts, offset: int, size: int, programs: int, out, unroll: int, pdl: bool = False) -> None:
    read_kernel[(programs,)](base, starts, starts.numel(), offset, size, out, BLOCK=128 * VEC, UNROLL=unroll, PDL=pdl,
                             num_warps=4, launch_pdl=pdl)  # fmt: skip


def expert_words(layout: bench_real.Layout) -> tuple[int, int]:
    """int32 words of an expert's gemm1 part (w13 and its scales) and of its gemm2 part (w2 and its scales): K/2 code
    bytes and K/16 scale bytes a row."""
    h, i = layout.hidden, layout.inter
    return 2 * i * (h // 8 + h // 64), h * (i // 8 + i // 64)


def _layer(layout: bench_real.Layout, gen: torch.Generator) -> tuple[torch.Tensor, int, int]:
    """A layer as one int32 tensor of random bytes, expert by expert [w13 | w13 scales | w2 | w2 scales] (the NVFP4
    shapes' bytes), with the int32 elements of an expert's gemm1 part and of its gemm2 part."""
    gemm1, gemm2 = expert_words(layout)
    size = (layout.num_experts * (gemm1 + gemm2),)
    data = torch.randint(-(2**31), 2**31 - 1, size, generator=gen, device="cuda", dtype=torch.int32)
    return data, gemm1, gemm2


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    gen = generator(43)
    layout = bench_real.LAYOUTS["ep8"]
    bw = bench_real.copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = [_layer(layout, gen) for _ in range(2)]
    _, n13, n2 = copies[0]
    sink = torch.empty(max(p for p, _ in SCHEDULES) * sms, dtype=torch.int32, device="cuda")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for n in EXPERTS:
        steps = []  # (layer copy, starts of the step's experts)
        for step in range(bench_real.ROUTINGS):
            chosen = torch.randperm(layout.num_experts, generator=gen, device="cuda")[:n].to(torch.int64)
            steps.append((copies[step % 2][0], chosen * (n13 + n2)))
        first = steps[0][1][:1]
        floor = n * (n13 + n2) * 4 / bw * 1e6
        for per_sm, unroll in SCHEDULES:
            programs = per_sm * sms

            def one(steps=steps, programs=programs, unroll=unroll):
                for data, starts in steps:
                    launch_read(data, starts, 0, n13 + n2, programs, sink, unroll)

            def two(steps=steps, programs=programs, unroll=unroll):
                for data, starts in steps:
                    launch_read(data, starts, 0, n13, programs, sink, unroll)
                    launch_read(data, starts, n13, n2, programs, sink, unroll)

            def four(steps=steps, first=first, programs=programs, unroll=unroll, pdl=False):
                for data, starts in steps:
                    launch_read(data, first, 0, 64, 1, sink, 1, pdl)  # a routing-sized launch: one program, 256 bytes
                    launch_read(data, starts, 0, n13, programs, sink, unroll, pdl)
                    launch_read(data, starts, n13, n2, programs, sink, unroll, pdl)
                    launch_read(data, first, 0, 64, 1, sink, 1, pdl)  # a sum-sized one

            times = {name: bench_real._time(fn, True, len(steps)) * 1e3 for name, fn in
                     (("one launch", one), ("two launches", two), ("four launches", four),
                      ("four launches, PDL", lambda four=four: four(pdl=True)))}  # fmt: skip
            rows.append({"experts": n, "programs_per_sm": per_sm, "loads_in_flight": unroll,
                         "bytes": n * (n13 + n2) * 4, "floor_us": floor, "us": times})  # fmt: skip
            cells = " | ".join(f"{k} {v:6.2f} us (floor / it {floor / v:.0%})" for k, v in times.items())
            print(f"ep8 n={n} {per_sm} a SM, {unroll} in flight: floor {floor:6.2f} us | {cells}", flush=True)
    (out_dir / "read_floor.json").write_text(json.dumps({"copy_bandwidth": bw, "rows": rows}, indent=1) + "\n")
