"""Experiment: what decoding a step's weights into the tensor cores takes in one launch, with nothing else.

``read_floor.py`` times plain reads of a step's expert bytes. This times the same bytes read, decoded and multiplied
by the op's own K step (``load_quarters`` and ``nvfp4_dot`` of ``kernels/nvfp4_decode.py``, the Triton kernels' decode
and four quarter-width dots against a 16-column activation tile, the kernel_wgmma layout the op takes on sm_90) in
one launch: work units (expert, 64-row tile of w13 or w2, K slice of a few K steps), dealt over the programs, each
storing its fp32 tile and nothing else: no routing, no split sums, no SiLU, no wait for h, no top-k sum. So its time
is what the decode and the dots cost over the reads when nothing chains them, the least a one-launch op built on
these K steps could take. Random bytes for codes and scales (the time does not depend on the values), the same
activation vector for every row, CUDA graphs over 16 steps on two copies of the layer, beside the one-launch read of
the same bytes (``read_floor``'s kernel, 16 programs a SM, 8 loads in flight).
Run 41 (bench/README.md): 26-33 us at one expert, slower than the whole op (22.5 us): short K slices over a flat grid
at two to four programs a SM decode at about 1.5e12 weights/s, a third of the op's rate at busy sizes, so this form is
no floor; it is the one-launch op's units without their chains, and as slow.
Usage: python bench/exp/decode_floor.py OUT_DIR   (BENCH_SEED, default 43; EXP_EXPERTS, default 1,2,4)
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from decode_cases import generator
from read_floor import expert_words, launch_read

from sglang_glm5 import bench_real
from sglang_glm5.kernels.nvfp4_decode import load_quarters, nvfp4_dot

EXPERTS = tuple(int(n) for n in os.environ.get("EXP_EXPERTS", "1,2,4").split(","))
# (programs a SM, K steps a w13 unit, K steps a w2 unit, stages) tried in turn
SCHEDULES = ((2, 3, 2, 3), (2, 6, 4, 3), (3, 3, 2, 2), (3, 2, 2, 2), (4, 3, 2, 2), (2, 4, 8, 3))
BLOCK_N, BLOCK_K, BLOCK_M = 64, 256, 16
LAYOUT = 2  # kernel_wgmma: the op's layout on sm_90


@triton.jit
def _unit(w_ptr, s_ptr, x_ptr, part_ptr, u, expert, tile, k_begin, steps, stride_we, stride_wn, stride_se, stride_sn,
          K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
          LAYOUT: tl.constexpr):  # fmt: skip
    rows = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    w_rows = w_ptr + expert * stride_we + rows * stride_wn
    s_rows = s_ptr + expert * stride_se + rows * stride_sn
    m = tl.arange(0, BLOCK_M)
    x_rows = x_ptr + m * 0
    row_ok = m >= 0
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_begin, k_begin + steps * BLOCK_K, BLOCK_K):
        x0, x1, x2, x3 = load_quarters(x_rows, k0, row_ok, K, BLOCK_K, True, LAYOUT, False)
        acc = nvfp4_dot(acc, w_rows, s_rows, x0, x1, x2, x3, k0, K, BLOCK_K, True, LAYOUT, False)
    out = part_ptr + u.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out, tl.sum(acc, axis=1))


@triton.jit
def decode_kernel(w13_ptr, s13_ptr, w2_ptr, s2_ptr, x_ptr, experts_ptr, num_experts, part_ptr, stride_13e, stride_13n,
                  stride_s13e, stride_s13n, stride_2e, stride_2n, stride_s2e, stride_s2n, HIDDEN: tl.constexpr,
                  INTER: tl.constexpr, STEPS1: tl.constexpr, STEPS2: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, LAYOUT: tl.constexpr):  # fmt: skip
    """Units (expert, tile, K slice) of w13 (2I rows, K = H) then of w2 (H rows, K = I), unit u by program u mod
    programs; each stores its tile's row sums (fp32) at part[u]."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles1: tl.constexpr = 2 * INTER // BLOCK_N
    slices1: tl.constexpr = HIDDEN // (BLOCK_K * STEPS1)
    tiles2: tl.constexpr = HIDDEN // BLOCK_N
    slices2: tl.constexpr = INTER // (BLOCK_K * STEPS2)
    units1 = num_experts * tiles1 * slices1
    for u in range(pid, units1 + num_experts * tiles2 * slices2, programs):
        if u < units1:
            expert = tl.load(experts_ptr + u // (tiles1 * slices1)).to(tl.int64)
            _unit(w13_ptr, s13_ptr, x_ptr, part_ptr, u, expert, (u // slices1) % tiles1,
                  (u % slices1) * STEPS1 * BLOCK_K, STEPS1, stride_13e, stride_13n, stride_s13e, stride_s13n, HIDDEN,
                  BLOCK_N, BLOCK_K, BLOCK_M, LAYOUT)  # fmt: skip
        else:
            v = u - units1
            expert = tl.load(experts_ptr + v // (tiles2 * slices2)).to(tl.int64)
            _unit(w2_ptr, s2_ptr, x_ptr, part_ptr, u, expert, (v // slices2) % tiles2,
                  (v % slices2) * STEPS2 * BLOCK_K, STEPS2, stride_2e, stride_2n, stride_s2e, stride_s2n, INTER,
                  BLOCK_N, BLOCK_K, BLOCK_M, LAYOUT)  # fmt: skip


def _layer(layout: bench_real.Layout, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One random layer: w13 [E, 2I, H/4] int16, its scales [E, 2I, H/16] uint8, w2 and its scales likewise, and the
    same bytes as one int32 tensor expert by expert for the read (read_floor's layout)."""
    e, h, i = layout.num_experts, layout.hidden, layout.inter
    gemm1, gemm2 = expert_words(layout)
    flat = torch.randint(-(2**31), 2**31 - 1, (e, gemm1 + gemm2), generator=gen, device="cuda", dtype=torch.int32)
    w13 = flat[:, : 2 * i * h // 8].view(torch.int16).view(e, 2 * i, h // 4)
    s13 = flat[:, 2 * i * h // 8 : gemm1].view(torch.uint8).view(e, 2 * i, h // 16)
    w2 = flat[:, gemm1 : gemm1 + h * i // 8].view(torch.int16).view(e, h, i // 4)
    s2 = flat[:, gemm1 + h * i // 8 :].view(torch.uint8).view(e, h, i // 16)
    return w13, s13, w2, s2, flat.view(-1), gemm1 + gemm2


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    gen = generator(43)
    layout = bench_real.LAYOUTS["ep8"]
    h, i = layout.hidden, layout.inter
    bw = bench_real.copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = [_layer(layout, gen) for _ in range(2)]
    x = torch.randn(h, generator=gen, device="cuda").bfloat16()
    part = torch.empty(4 * (2 * i + h) * h // BLOCK_K, dtype=torch.float32, device="cuda")
    sink = torch.empty(16 * sms, dtype=torch.int32, device="cuda")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for n in EXPERTS:
        per_expert = copies[0][5]
        steps = []  # (layer copy, the step's experts, where their words start in the flat layer)
        for step in range(bench_real.ROUTINGS):
            chosen = torch.randperm(layout.num_experts, generator=gen, device="cuda")[:n]
            steps.append((copies[step % 2], chosen, chosen * per_expert))
        floor = n * per_expert * 4 / bw * 1e6

        def read(steps=steps, per_expert=per_expert):
            for layer, _, starts in steps:
                launch_read(layer[4], starts, 0, per_expert, 16 * sms, sink, 8)

        times = {"read, one launch": bench_real._time(read, True, len(steps)) * 1e3}
        for per_sm, steps1, steps2, stages in SCHEDULES:

            def decode(steps=steps, per_sm=per_sm, steps1=steps1, steps2=steps2, stages=stages):
                for (w13, s13, w2, s2, _, _), chosen, _ in steps:
                    decode_kernel[(per_sm * sms,)](
                        w13, s13, w2, s2, x, chosen, chosen.numel(), part, w13.stride(0), w13.stride(1),
                        s13.stride(0), s13.stride(1), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1),
                        HIDDEN=h, INTER=i, STEPS1=steps1, STEPS2=steps2, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                        BLOCK_M=BLOCK_M, LAYOUT=LAYOUT, num_warps=4, num_stages=stages,
                    )  # fmt: skip

            label = f"decode, {per_sm} a SM, {steps1}/{steps2} steps a unit, s{stages}"
            times[label] = bench_real._time(decode, True, len(steps)) * 1e3
        rows.append({"experts": n, "floor_us": floor, "us": times})
        cells = " | ".join(f"{k} {v:6.2f}" for k, v in times.items())
        print(f"ep8 n={n}: floor {floor:6.2f} us | {cells}", flush=True)
    (out_dir / "decode_floor.json").write_text(json.dumps({"copy_bandwidth": bw, "rows": rows}, indent=1) + "\n")
