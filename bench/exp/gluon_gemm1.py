"""gemm1 at decode sizes written in Gluon (Triton's explicit-layout dialect), against the op's Triton gemm1.

The op's gemm1 (``kernels/nvfp4_moe.py``) waits for each quarter-width wgmma before it decodes the next quarter:
Triton keeps a wgmma whose left operand sits in registers synchronous, and schedules the copies and the decode
itself. Here the same work (weights in the "kernel_wgmma" layout, the same PTX decode, the same quarter dots and K
order) is written with explicit layouts: each quarter's wgmma is issued asynchronously and waited for only when its
registers are needed again (``LOOKAHEAD`` quarters in flight), the packed weights and activations come through a
``STAGES``-deep ring of cp.async copies (padding rows zero-filled, not read, with ``MASK_ROWS``: else every program
reads token 0's row, an L2 hot spot), the block scales are copied to shared memory once a K step and read back in
the layout of the wgmma operand; optional K splits (``SPLITS``: the op's deterministic last-arriver sum) and
programmatic dependent launch (``PDL``). ``bench/README.md`` ("gemm1 in Gluon ...: run 29") has the results.

    STEPS=exp EXP=bench/exp/gluon_gemm1.py bash bench/device_run.sh                  # unsplit, B = 16-256
    EXP_MODE=decode STEPS=exp EXP=bench/exp/gluon_gemm1.py bash bench/device_run.sh  # against the op's plan, B = 1-16
    PYTHONPATH=<triton 3.6> python bench/exp/gluon_gemm1.py aot ARCH BLOCK_N BLOCK_K STAGES LOOKAHEAD LATE MASK ...

The first writes ``$OUT/gluon_gemm1.json`` (per case: each kernel's median device time from CUDA graphs of 20
launches, h's largest relative difference from the op's, the touched-experts floor of gemm1's bytes), the second
``$OUT/gluon_gemm1_decode.json``; ``GLUON_PROFILE=1`` launches each kernel once, for Nsight (``gluon_ncu.sh``).
"""

import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from sglang_glm5.kernels.nvfp4_moe import decode_ptx

# A CTA barrier: gl.thread_barrier in Triton 3.6, gl.barrier from 3.7.
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

# The op's decode, bf16 activations, "kernel_wgmma" layout (2), code position q: one 32-bit scale code a register.
_PTX = gl.constexpr(tuple(decode_ptx(True, q, 2) for q in range(4)))


@gluon.jit
def _decode(packed, scale, Q: gl.constexpr):
    return gl.inline_asm_elementwise(_PTX[Q], "=r,r,r,r", [packed, scale], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def _issue_copies(
    wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, k0,
    wg_rows, wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_cols, x_ok,
):  # fmt: skip
    """cp.async of K step k0 into ring slot ``slot``: gate and up packed words, their scale bytes, four activation
    quarters (rows of padding zero-filled, not read: ``x_ok``). One allocation each, so that the compiler sees no two
    copies of a step overlap (else it puts a CTA barrier between them)."""
    cp.async_copy_global_to_shared(wg_s.index(slot), wg_rows[:, None] + (k0 // 4 + w_cols)[None, :])
    cp.async_copy_global_to_shared(wu_s.index(slot), wu_rows[:, None] + (k0 // 4 + w_cols)[None, :])
    cp.async_copy_global_to_shared(sg_s.index(slot), sg_rows[:, None] + (k0 // 16 + s_cols)[None, :])
    cp.async_copy_global_to_shared(su_s.index(slot), su_rows[:, None] + (k0 // 16 + s_cols)[None, :])
    # quarter q of the step: columns k0 + 32g + 8q + j (the permuted K order), j < 8: one 16-byte copy
    pos = x_rows[:, None] + (k0 + (x_cols // 8) * 32 + x_cols % 8)[None, :]
    cp.async_copy_global_to_shared(x0_s.index(slot), pos, mask=x_ok)
    cp.async_copy_global_to_shared(x1_s.index(slot), pos + 8, mask=x_ok)
    cp.async_copy_global_to_shared(x2_s.index(slot), pos + 16, mask=x_ok)
    cp.async_copy_global_to_shared(x3_s.index(slot), pos + 24, mask=x_ok)


@gluon.jit
def _quarter(pg, pu, sg, su, xq, acc_g, acc_u, Q: gl.constexpr, LOOKAHEAD: gl.constexpr):
    """Quarter Q of a K step, gate and up: decode, then issue the wgmma without waiting for it; wait only until at
    most LOOKAHEAD quarters (two wgmma groups each) are in flight, the decoded registers kept alive until then."""
    ag = _decode(pg, sg, Q)
    acc_g = warpgroup_mma(ag, xq, acc_g, is_async=True)
    au = _decode(pu, su, Q)
    acc_u = warpgroup_mma(au, xq, acc_u, is_async=True)
    acc_g, acc_u, ag, au = warpgroup_mma_wait(num_outstanding=2 * LOOKAHEAD, deps=(acc_g, acc_u, ag, au))
    return acc_g, acc_u


@gluon.jit
def gemm1_gluon_kernel(
    x_ptr,  # [T, H] bf16, prepared activations (the kernel_wgmma K order)
    w_ptr,  # [E, 2I, H/4] int16, packed codes (kernel_wgmma layout)
    ws_ptr,  # [E, 2I, H/16] uint8 scale codes
    wgs_ptr,  # [E, 2] fp32 global scales
    sorted_ids_ptr,  # [blocks * BLOCK_M] int32
    block_expert_ptr,  # [blocks] int32, -1 = no work
    h_ptr,  # [P, I] bf16 out, permuted K order
    part_ptr,  # [SPLITS, P, 2, I] fp32 partial sums of gate and up (SPLITS > 1)
    counter_ptr,  # [blocks, N tiles] int32, zero on entry and left zero (SPLITS > 1)
    num_pairs, top_k, inter_size, hidden_size, k_per_split,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse, stride_gsg, stride_ht,
    gate_row0, up_row0,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOOKAHEAD: gl.constexpr,  # quarter wgmmas (of gate and up each) left in flight while the next is decoded
    COPY_LATE: gl.constexpr = False,  # issue a step's copies after its wgmmas (as Triton's pipeliner does), not first
    MASK_ROWS: gl.constexpr = False,  # copy only the block's real rows (as the op does), padding zero-filled
    WARPS: gl.constexpr = 4,  # 4: one warp group for BLOCK_N rows; 8: two, each BLOCK_N / 2 rows
    SPLITS: gl.constexpr = 1,  # grid axis 2 splits K; the last program of a tile to finish adds the partials in order
    PDL: gl.constexpr = False,  # programmatic dependent launch: wait for the launch before, let the next start early
):  # fmt: skip
    QK: gl.constexpr = BLOCK_K // 4  # packed words a row a K step (4 codes each)
    SK: gl.constexpr = BLOCK_K // 16  # scale codes a row a K step
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    expert = gl.load(block_expert_ptr + pid_m)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_M, 16])  # fmt: skip
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        # copies: 16 bytes a thread, rows across warps
        wc_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // QK, QK // 8], [WARPS, 1], [1, 0])
        sc_l: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [WARPS, 1], [1, 0])
        XV: gl.constexpr = 8 if WARPS == 4 else 4  # elements a copy: [16, QK] over the threads once
        xc_l: gl.constexpr = gl.BlockedLayout([1, XV], [32 * XV // QK, QK // XV], [WARPS, 1], [1, 0])
        w_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, QK], gl.int16)
        s_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, QK], gl.bfloat16)
        wg_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_sl)
        wu_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_sl)
        sg_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], s_sl)
        su_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], s_sl)
        x0_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl)
        x1_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl)
        x2_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl)
        x3_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl)

        # The scale code of each packed register, in the operand's layout: block b of each 16 words is word
        # slots 2b, 2b + 1, 2b + 8, 2b + 9 (kernel_wgmma), so a [BLOCK_N, SK] tile read as [BLOCK_N, QK // 16, 4]
        # and broadcast over slot bits 0 and 3 is the [BLOCK_N, QK] tile of codes. L5: the operand's layout as 5-d.
        shape5: gl.constexpr = [BLOCK_N, QK // 16, 2, 4, 2]
        z5 = gl.reshape(gl.zeros([BLOCK_N, QK], gl.int32, layout=a_l), shape5)
        L5: gl.constexpr = z5.type.layout
        S3: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, L5))
        zero5 = gl.zeros(shape5, gl.int32, layout=L5)

        # rows of this N tile (gate and up), columns of the copies
        rows_w = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wc_l))
        rows_w = gl.where(rows_w < inter_size, rows_w, 0).to(gl.int64)
        wg_rows = w_ptr + e64 * stride_we + (gate_row0 + rows_w) * stride_wn
        wu_rows = w_ptr + e64 * stride_we + (up_row0 + rows_w) * stride_wn
        rows_s = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, sc_l))
        rows_s = gl.where(rows_s < inter_size, rows_s, 0).to(gl.int64)
        sg_rows = ws_ptr + e64 * stride_se + (gate_row0 + rows_s) * stride_sn
        su_rows = ws_ptr + e64 * stride_se + (up_row0 + rows_s) * stride_sn
        w_cols = gl.arange(0, QK, layout=gl.SliceLayout(0, wc_l))
        s_cols = gl.arange(0, SK, layout=gl.SliceLayout(0, sc_l))
        x_cols = gl.arange(0, QK, layout=gl.SliceLayout(0, xc_l))
        pair = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, xc_l)))
        token = gl.where(pair < num_pairs, pair // top_k, 0).to(gl.int64)
        x_rows = x_ptr + token * stride_xt
        if MASK_ROWS:  # padding rows zero-filled; else they read token 0's row (unused columns of the result)
            x_ok = (pair < num_pairs)[:, None] & (x_cols < QK)[None, :]
        else:
            x_ok = None

        k_begin = 0
        k_end = hidden_size
        if SPLITS > 1:
            k_begin = gl.multiple_of(gl.program_id(2) * k_per_split, BLOCK_K)
            k_end = gl.minimum(k_begin + k_per_split, hidden_size)
        steps = gl.cdiv(k_end - k_begin, BLOCK_K)
        for i in gl.static_range(STAGES - 1):
            if i < steps:
                _issue_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, i, k_begin + i * BLOCK_K, wg_rows,
                              wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_cols, x_ok)  # fmt: skip
            cp.commit_group()

        acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        for i in range(steps):
            slot = i % STAGES
            cp.wait_group(STAGES - 2)
            _cta_barrier()  # every thread's copies of step i landed; every wgmma of step i - 1 was waited for
            nxt = i + STAGES - 1
            if not COPY_LATE:
                if nxt < steps:
                    _issue_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, nxt % STAGES, k_begin + nxt * BLOCK_K,
                                  wg_rows, wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_cols, x_ok)  # fmt: skip
                cp.commit_group()
            pg = wg_s.index(slot).load(a_l)
            pu = wu_s.index(slot).load(a_l)
            sg3 = sg_s.index(slot).reshape([BLOCK_N, QK // 16, 4]).load(S3).to(gl.int32)
            su3 = su_s.index(slot).reshape([BLOCK_N, QK // 16, 4]).load(S3).to(gl.int32)
            sg = gl.convert_layout(
                gl.reshape(gl.expand_dims(gl.expand_dims(sg3, 2), 4) + zero5, [BLOCK_N, QK]), a_l, assert_trivial=True
            )
            su = gl.convert_layout(
                gl.reshape(gl.expand_dims(gl.expand_dims(su3, 2), 4) + zero5, [BLOCK_N, QK]), a_l, assert_trivial=True
            )
            acc_g, acc_u = _quarter(pg, pu, sg, su, x0_s.index(slot).permute((1, 0)), acc_g, acc_u, 0, LOOKAHEAD)
            acc_g, acc_u = _quarter(pg, pu, sg, su, x1_s.index(slot).permute((1, 0)), acc_g, acc_u, 1, LOOKAHEAD)
            acc_g, acc_u = _quarter(pg, pu, sg, su, x2_s.index(slot).permute((1, 0)), acc_g, acc_u, 2, LOOKAHEAD)
            acc_g, acc_u = _quarter(pg, pu, sg, su, x3_s.index(slot).permute((1, 0)), acc_g, acc_u, 3, LOOKAHEAD)
            if COPY_LATE:
                # slot nxt % STAGES was step i - 1's: its wgmmas are done (at most this step's are in flight), and
                # every warp's reads of it came before this step's barrier
                if nxt < steps:
                    _issue_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, nxt % STAGES, k_begin + nxt * BLOCK_K,
                                  wg_rows, wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_cols, x_ok)  # fmt: skip
                cp.commit_group()
            else:
                acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
        acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
        cp.wait_group(0)
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip

        n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        pair_o = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma)))
        ok = (pair_o < num_pairs)[None, :] & (n < inter_size)[:, None]
        pair_safe = gl.where(pair_o < num_pairs, pair_o, 0).to(gl.int64)
        if SPLITS > 1:
            # part[s, p, 0, n] = gate, part[s, p, 1, n] = up
            split_stride = num_pairs * 2 * inter_size
            p_ptrs = part_ptr + pair_safe[None, :] * (2 * inter_size) + n[:, None]
            gl.store(p_ptrs + gl.program_id(2) * split_stride, acc_g, mask=ok)
            gl.store(p_ptrs + gl.program_id(2) * split_stride + inter_size, acc_u, mask=ok)
            _cta_barrier()  # every thread's partials are written before the counter says so
            counter = counter_ptr + pid_m * gl.num_programs(1) + pid_n
            arrived = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                gl.store(counter, 0)
                acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
                acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
                for split in gl.static_range(SPLITS):
                    acc_g += gl.load(p_ptrs + split * split_stride, mask=ok, other=0.0, cache_modifier=".cg")
                    acc_u += gl.load(p_ptrs + split * split_stride + inter_size, mask=ok, other=0.0,
                                     cache_modifier=".cg")  # fmt: skip
                _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht)
        else:
            _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht)


@gluon.jit
def _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht):
    """h = SiLU(gate) * up, global scales and 2^7 applied, in the permuted K order (column 64g + 16b + 8h + 4i + q
    at 64g + 32h + 8q + 2b + i)."""
    gs_gate = gl.load(wgs_ptr + e64 * stride_gse) * 128.0
    gs_up = gl.load(wgs_ptr + e64 * stride_gse + stride_gsg) * 128.0
    gate = acc_g * gs_gate
    h = gate / (1.0 + gl.exp(-gate)) * (acc_u * gs_up)
    col = (n // 64) * 64 + ((n // 8) % 2) * 32 + (n % 4) * 8 + ((n % 64) // 16) * 2 + (n // 4) % 2
    gl.store(h_ptr + pair_safe[None, :] * stride_ht + col[:, None], h.to(gl.bfloat16), mask=ok)


def launch(xp, w13, w13_scale, gs13, route, h, top_k, gate_row0, up_row0, block_n=128, block_k=256, stages=3,
           lookahead=1, copy_late=False, mask_rows=False, warps=4, splits=1, scratch=None, pdl=False):  # fmt: skip
    """The Gluon gemm1 over every possible block (idle ones return at once), BLOCK_M 16. ``splits`` > 1 splits K
    over grid axis 2; ``scratch`` = (part, counters) then: fp32 [splits, P, 2, I] and zeroed int32 [blocks, N tiles]."""
    import torch

    from sglang_glm5.variants.w4a16 import k_splits

    num_pairs, inter = h.shape
    w13 = w13.view(torch.int16)
    splits, per_split = k_splits(xp.shape[1], block_k, splits)
    grid = (route.block_expert.numel(), triton.cdiv(inter, block_n), splits)
    part, counters = scratch if splits > 1 else (h, route.used_blocks)
    gemm1_gluon_kernel[grid](
        xp, w13, w13_scale.view(torch.uint8), gs13, route.sorted_ids, route.block_expert, h, part, counters,
        num_pairs, top_k, inter, xp.shape[1], per_split,
        xp.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1), gs13.stride(0),
        gs13.stride(1), h.stride(0), gate_row0, up_row0,
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, LOOKAHEAD=lookahead, COPY_LATE=copy_late,
        MASK_ROWS=mask_rows, WARPS=warps, SPLITS=splits, PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )  # fmt: skip


def aot(arch=90, block_n=128, block_k=256, stages=3, lookahead=1, late=0, mask=0, warps=4, splits=1, pdl=0):
    """Compile for sm_{arch} on the CPU: (registers?, shared bytes, ptxas warnings are printed by Triton)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ptrs = {"x_ptr": "*bf16", "w_ptr": "*i16", "ws_ptr": "*u8", "wgs_ptr": "*fp32", "sorted_ids_ptr": "*i32",
            "block_expert_ptr": "*i32", "h_ptr": "*bf16", "part_ptr": "*fp32", "counter_ptr": "*i32"}  # fmt: skip
    consts = {"BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": block_k, "STAGES": stages, "LOOKAHEAD": lookahead,
              "COPY_LATE": bool(late), "MASK_ROWS": bool(mask), "WARPS": warps,
              "SPLITS": splits, "PDL": bool(pdl)}  # fmt: skip
    fn = gemm1_gluon_kernel
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in fn.arg_names}
    divisible = {"x_ptr", "w_ptr", "ws_ptr", "wgs_ptr", "sorted_ids_ptr", "block_expert_ptr", "h_ptr",
                 "inter_size", "hidden_size", "k_per_split", "stride_xt", "stride_we", "stride_wn", "stride_se",
                 "stride_sn", "stride_ht"}  # fmt: skip
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in divisible}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


BASELINES = ("16x128x256-w4-s3", "16x64x256-w4-s3")
# name -> (block_n, block_k, stages, lookahead[, copy_late[, mask_rows[, warps]]])
GLUON = {"g16x64x256-s3-la1": (64, 256, 3, 1), "g16x64x256-s3-la1-mask": (64, 256, 3, 1, False, True),
         "g16x64x256-s3-la0-mask": (64, 256, 3, 0, False, True),
         "g16x64x256-s3-la2-mask": (64, 256, 3, 2, False, True),
         "g16x64x256-s4-la1-mask": (64, 256, 4, 1, False, True),
         "g16x64x128-s4-la1-mask": (64, 128, 4, 1, False, True),
         "g16x128x256-w8-s3-la1-mask": (128, 256, 3, 1, False, True, 8),
         "g16x128x128-w8-s4-la1-mask": (128, 128, 4, 1, False, True, 8)}  # fmt: skip


def main(out) -> None:
    import functools
    import json
    import os
    import statistics

    import decode_cases as dc
    import torch

    from sglang_glm5 import bench_real
    from sglang_glm5.routing import route_pairs
    from sglang_glm5.tiles import GemmConfig
    from sglang_glm5.variants.w4a16 import launch_gemm1

    batches = [int(b) for b in os.environ.get("EXP_BATCHES", "16,32,64,128,256").split(",")]
    profile = os.environ.get("GLUON_PROFILE") == "1"  # one launch of each kernel, for Nsight Compute
    gen = dc.generator(97)
    bw = bench_real.copy_bandwidth()
    rows = []
    for name, layout, bundles, batch, inputs in dc.cases(gen, batches):
        weights = bundles[0]
        x, _, ids = inputs[0]
        num_pairs = ids.numel()
        xp = torch.empty_like(x)
        route = route_pairs(ids, layout.num_experts, 16, permute=(x, xp), layout=weights.layout)
        gate_row0, up_row0 = weights.gate_up_rows
        args = (xp, weights.w13, weights.w13_scale, weights.w13_scale_2, route)
        outs, fns = {}, {}
        for label in BASELINES:
            h = torch.zeros((num_pairs, layout.inter), dtype=torch.bfloat16, device="cuda")
            fns[label] = (functools.partial(launch_gemm1, *args, h, GemmConfig.from_label(label), ids.shape[1],
                                            gate_row0, up_row0, False, layout=weights.layout), h)  # fmt: skip
        for label, tile in GLUON.items():
            h = torch.zeros((num_pairs, layout.inter), dtype=torch.bfloat16, device="cuda")
            fns[label] = (functools.partial(launch, *args, h, ids.shape[1], gate_row0, up_row0, *tile), h)
        if profile:
            for fn, _h in fns.values():
                fn()
                torch.cuda.synchronize()
            return
        valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
        for label, (fn, h) in fns.items():
            fn()
            torch.cuda.synchronize()
            outs[label] = h[valid].float()
        ref = outs[BASELINES[0]]
        rel = {k: ((v - ref).norm() / ref.norm()).item() for k, v in outs.items()}
        same = {k: bool(torch.equal(v, ref)) for k, v in outs.items()}
        times = {k: [] for k in fns}
        for _ in range(3):
            for label, (fn, _h) in fns.items():
                times[label].append(bench_real._time(lambda fn=fn: [fn() for _ in range(20)], True, 20))
        touched = int(torch.unique(ids[ids >= 0]).numel())
        gemm1_bytes = touched * layout.expert_bytes * 2 / 3
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med[BASELINES[0]]
        row = {"layout": name, "batch": batch, "touched": touched, "gemm1_floor_us": gemm1_bytes / bw * 1e6,
               "us": {k: v * 1e3 for k, v in med.items()}, "rel_diff": rel, "bit_identical": same}  # fmt: skip
        rows.append(row)
        cells = " | ".join(f"{k} {v * 1e3:7.1f} ({v / base:.3f}{'' if same[k] else f', {rel[k]:.1e}'})"
                           for k, v in med.items())  # fmt: skip
        print(f"{name} B={batch:4d} touched {touched:3d} floor {row['gemm1_floor_us']:6.1f} us | {cells}", flush=True)
    (out / "gluon_gemm1.json").write_text(json.dumps(rows, indent=1) + "\n")


def decode_main(out) -> None:
    """B = 1-16 (EXP_BATCHES): the op's gemm1 with its cached tile and planned grid (K splits or stream-K, as the op
    launches it), against the Gluon form split over K for about 1, 2 and 4 programs per SM by the op's estimate of the
    blocks (``w4a16.expected_blocks``), and unsplit. Writes ``out/gluon_gemm1_decode.json``."""
    import functools
    import json
    import math
    import os
    import statistics

    import decode_cases as dc
    import torch

    from sglang_glm5 import bench_real
    from sglang_glm5.routing import route_pairs
    from sglang_glm5.variants import w4a16

    batches = [int(b) for b in os.environ.get("EXP_BATCHES", "1,2,4,8,16").split(",")]
    gen = dc.generator(101)
    bw = bench_real.copy_bandwidth()
    sms = w4a16.sm_count(torch.cuda.current_device())
    rows = []
    for name, layout, bundles, batch, inputs in dc.cases(gen, batches):
        weights = bundles[0]
        x, _, ids = inputs[0]
        num_pairs = ids.numel()
        num_experts, inter = layout.num_experts, layout.inter
        cfg = dc.cached_config(layout, batch)
        plan = w4a16.plan_gemms(cfg, num_pairs, num_experts, bench_real.GLOBAL_EXPERTS, layout.hidden, inter, sms)
        xp = torch.empty_like(x)
        each_pair = num_pairs <= min(w4a16.EACH_PAIR_MAX_PAIRS, num_experts)
        route = route_pairs(ids, num_experts, 16, permute=(x, xp), layout=weights.layout, each_pair=each_pair)
        blocks = route.block_expert.numel()
        gate_row0, up_row0 = weights.gate_up_rows
        args = (xp, weights.w13, weights.w13_scale, weights.w13_scale_2, route)
        fns = {}
        h = torch.zeros((num_pairs, inter), dtype=torch.bfloat16, device="cuda")
        counters = torch.zeros(max(plan.counters, 1), dtype=torch.int32, device="cuda")
        op_label = f"op {cfg.gemm1.label} {plan.gemm1}"
        op = functools.partial(w4a16.launch_gemm1, *args, h, cfg.gemm1, ids.shape[1], gate_row0, up_row0, False,
                               launch=plan.gemm1, counters=counters, layout=weights.layout)  # fmt: skip
        fns["op"] = (op, h)
        expected = w4a16.expected_blocks(num_pairs, num_experts, bench_real.GLOBAL_EXPERTS, 16)
        tiles = triton.cdiv(inter, 64)
        for pps in (1, 2, 4, 0):
            want = math.ceil(pps * sms / (max(1.0, expected) * tiles)) if pps else 1
            splits, _ = w4a16.k_splits(layout.hidden, 256, want)
            label = f"g16x64x256-s3-la1-mask-k{splits}"
            if label in fns:
                continue
            hg = torch.zeros((num_pairs, inter), dtype=torch.bfloat16, device="cuda")
            part = torch.empty((splits, num_pairs, 2, inter), dtype=torch.float32, device="cuda")
            cnt = torch.zeros(blocks * tiles, dtype=torch.int32, device="cuda")
            fns[label] = (functools.partial(launch, *args, hg, ids.shape[1], gate_row0, up_row0, 64, 256, 3, 1, False,
                                            True, 4, splits, (part, cnt)), hg)  # fmt: skip
        valid = (ids.reshape(-1) >= 0).nonzero().squeeze(1)
        outs = {}
        for label, (fn, hh) in fns.items():
            fn()
            torch.cuda.synchronize()
            outs[label] = hh[valid].float()
        ref = outs["op"]
        rel = {k: ((v - ref).norm() / ref.norm()).item() for k, v in outs.items()}
        times = {k: [] for k in fns}
        for _ in range(3):
            for label, (fn, _h) in fns.items():
                times[label].append(bench_real._time(lambda fn=fn: [fn() for _ in range(20)], True, 20))
        touched = int(torch.unique(ids[ids >= 0]).numel())
        floor_us = touched * layout.expert_bytes * 2 / 3 / bw * 1e6
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append({"layout": name, "batch": batch, "touched": touched, "gemm1_floor_us": floor_us, "op": op_label,
                     "us": med, "rel_diff": rel})  # fmt: skip
        cells = " | ".join(f"{k} {v:6.1f} ({v / med['op']:.3f}, {rel[k]:.0e})" for k, v in med.items())
        print(f"{name} B={batch:3d} touched {touched:3d} floor {floor_us:5.1f} us | {op_label} | {cells}", flush=True)
    (out / "gluon_gemm1_decode.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["aot"]:
    k = aot(*map(int, sys.argv[2:]))
    print("shared", k.metadata.shared, "regs?", getattr(k, "n_regs", None))
    open("/tmp/gluon_gemm1.ptx", "w").write(k.asm["ptx"])
    open("/tmp/gluon_gemm1.ttgir", "w").write(k.asm["ttgir"])
    open("/tmp/gluon_gemm1.cubin", "wb").write(k.asm["cubin"])
elif __name__ == "__main__":
    import os
    import pathlib

    (decode_main if os.environ.get("EXP_MODE") == "decode" else main)(
        pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    )
