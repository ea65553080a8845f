"""The W4A16 op's GEMMs for sm_90, in Gluon (Triton's explicit-layout dialect): gemm1 (below) and gemm2
(``nvfp4_moe_gemm2_gluon_kernel``: the same schedule on one weight matrix; tested on the H200, not offered by the
tuner: slower there than the Triton gemm2, at decode and at chunked-prefill sizes). Decode tiles take routing blocks
of 16 pairs on one warp group; chunked-prefill tiles up to 128 pairs (the wgmma's N) on one or two (WARPS).

    P = T * top_k (token, slot) pairs, E = local experts, H = hidden size (gemm1's K), I = intermediate size

The same work as ``nvfp4_moe.nvfp4_moe_gemm1_kernel`` on weights in the "kernel_wgmma" layout (LAYOUT 2): per routing
block of BLOCK_M pairs and N tile of BLOCK_N rows of gate and of up, four quarter-width dots a K step (quarter q =
code q of every packed word against activation columns 4c + q of the permuted K order), the same PTX decode
(``nvfp4_decode.decode_ptx``), fp32 accumulation, h = SiLU(gate) * up written in the permuted K order. What differs is
the schedule, written out instead of left to Triton's pipeliner:

- the packed words, scale codes and four activation quarters of a K step come through a STAGES-deep ring of
  cp.async copies, one shared allocation per operand (the compiler then sees that the copies of a step do not
  overlap and puts no barrier between them); the copies of step i + STAGES - 1 are issued at the top of step i;
- rows of padding (pair id >= P) are zero-filled, never read: read, every program would load token 0's row at
  once, one L2 hot spot (2-4.7x slower on an H200);
- each quarter's wgmma (decoded weights as the register operand, activations from shared memory) is issued
  asynchronously and waited for when at most LOOKAHEAD quarters are left in flight, so the next quarter's decode
  overlaps the tensor cores (Triton keeps a wgmma with a register operand synchronous); with GATE_THEN_UP the
  four quarters of gate go first, then up's, so that one matrix's packed words are in registers at a time (the
  same wgmmas on each accumulator in the same order: the same bits);
- the block scales are read back from shared memory in the wgmma operand's layout: a thread's two words of a
  register share one block (the kernel_wgmma layout), and the broadcast to them is free
  (``convert_layout(..., assert_trivial=True)``).

K may be split over grid axis 2 (SPLITS): each program writes fp32 partials, the last to arrive at the tile's
integer counter adds them in split order (the result does not depend on timing) and applies SiLU * up, as the
Triton kernel does. With PDL the kernel waits for the launch before it (``griddepcontrol.wait``) before touching
memory and lets the next start after its K loop. A program per possible block; idle blocks (expert -1) return.

On the H200 the op with this gemm1 takes 0.84-0.97x its time with the Triton gemm1 at GLM-5 B = 1-8 and 0.89-0.95x
at B = 2048-8192 (chunked prefill).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from sglang_glm5._ints import cdiv
from sglang_glm5.kernels.nvfp4_decode import decode_ptx

# The decode of bf16 weights in the kernel_wgmma layout (2), code position q: a 32-bit scale code per register.
_PTX = gl.constexpr(tuple(decode_ptx(True, q, 2) for q in range(4)))
# A CTA barrier: gl.thread_barrier in Triton 3.6, gl.barrier from 3.7.
cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.constexpr_function
def mma_layout(block_m, warps):
    """The wgmma accumulators [weight rows, block_m pairs]: ``warps`` / 4 warp groups stacked along the weight rows,
    64 rows each, one wgmma of N = block_m pairs."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, block_m, 16])


@gluon.constexpr_function
def operand_layout(block_m, warps):
    """The wgmma's register operand (the decoded weights) for ``mma_layout(block_m, warps)``."""
    return gl.DotOperandLayout(operand_index=0, parent=mma_layout(block_m, warps), k_width=2)


@gluon.constexpr_function
def _scale_copy_layout(warps):
    """Copies of the scale codes: 16 bytes (one row's K step) a thread."""
    return gl.BlockedLayout([1, 16], [32, 1], [warps, 1], [1, 0])


@gluon.constexpr_function
def _copy_layout(qk, warps):
    """Copies of rows of ``qk`` 16-bit elements: 16 bytes (8 elements) a thread, rows across warps."""
    return gl.BlockedLayout([1, 8], [32 * 8 // qk, qk // 8], [warps, 1], [1, 0])


@gluon.jit
def _decode(packed, scale, Q: gl.constexpr):
    """Quarter Q of a packed tile: e2m1 * scale * 2^-7 in bf16 (``nvfp4_decode.decode_ptx``)."""
    return gl.inline_asm_elementwise(_PTX[Q], "=r,r,r,r", [packed, scale], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def grid_dependency(WAIT: gl.constexpr):
    """``griddepcontrol.wait`` (WAIT) or ``griddepcontrol.launch_dependents``: see ``moe_common.after_previous_launch``
    and ``let_next_launch``. Harmless without a dependent launch."""
    if WAIT:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)  # fmt: skip


@gluon.jit
def _mark_ready(ready_ptr, pid_m, READY: gl.constexpr):
    """``moe_common.mark_block_ready``: this program's tile of h for block pid_m is stored (release)."""
    if READY:
        cta_barrier()  # every thread's h is written before the counter says so
        gl.atomic_add(ready_ptr + pid_m, 1, sem="release", scope="gpu")


@gluon.jit
def program_block(block_expert_ptr, PDL: gl.constexpr, BLOCKS_LAST: gl.constexpr = False):
    """(routing block, N program, the block's expert: -1 = no work) of this program: grid axes (block, N) or, with
    BLOCKS_LAST, (N, block); with PDL after waiting for the launch before it."""
    if PDL:
        grid_dependency(True)
    pid_m = gl.program_id(1 if BLOCKS_LAST else 0)
    return pid_m, gl.program_id(0 if BLOCKS_LAST else 1), gl.load(block_expert_ptr + pid_m)


@gluon.jit
def _operand_scales(s_slot, BLOCK_N: gl.constexpr, QK: gl.constexpr, a_l: gl.constexpr):
    """The scale code of each packed register of a K step, [BLOCK_N, QK] int32 in the wgmma operand's layout a_l,
    from a ring slot of [BLOCK_N, QK / 4] codes. Block b of each 16 words is word slots 2b, 2b + 1, 2b + 8, 2b + 9
    (the kernel_wgmma layout), so the slot read as [BLOCK_N, QK / 16, 4] and broadcast over slot bits 0 and 3 is the
    tile of codes; the broadcast stays in the registers that hold it (``assert_trivial``)."""
    shape5: gl.constexpr = [BLOCK_N, QK // 16, 2, 4, 2]
    zero5 = gl.reshape(gl.zeros([BLOCK_N, QK], gl.int32, layout=a_l), shape5)
    L5: gl.constexpr = zero5.type.layout
    S3: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, L5))
    s3 = s_slot.reshape([BLOCK_N, QK // 16, 4]).load(S3).to(gl.int32)
    return gl.convert_layout(gl.reshape(gl.expand_dims(gl.expand_dims(s3, 2), 4) + zero5, [BLOCK_N, QK]), a_l,
                             assert_trivial=True)  # fmt: skip


@gluon.jit
def _activation_rings(STAGES: gl.constexpr, BLOCK_M: gl.constexpr, QK: gl.constexpr):
    """The four rings of activation quarters, [STAGES, BLOCK_M, QK] bf16 each (one allocation per quarter: the
    compiler then sees that a step's copies do not overlap)."""
    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, QK], gl.bfloat16)
    return (gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, QK], x_sl))  # fmt: skip


@gluon.jit
def k_slice(k_size, k_per_split, BLOCK_K: gl.constexpr, SPLITS: gl.constexpr):
    """This program's first K column and its K steps: split ``gl.program_id(2)`` of ``k_per_split`` columns (SPLITS >
    1), else all of ``k_size``."""
    k_begin = 0
    k_end = k_size
    if SPLITS > 1:
        k_begin = gl.multiple_of(gl.program_id(2) * k_per_split, BLOCK_K)
        k_end = gl.minimum(k_begin + k_per_split, k_size)
    return k_begin, gl.cdiv(k_end - k_begin, BLOCK_K)


@gluon.jit
def gemm1_rings(STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, QK: gl.constexpr,
                SK: gl.constexpr):  # fmt: skip
    """gemm1's STAGES-deep rings: packed words of gate and up [STAGES, BLOCK_N, QK] int16, their scale codes
    [STAGES, BLOCK_N, SK] uint8, and the four activation quarters (``_activation_rings``)."""
    w_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, QK], gl.int16)
    s_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    wg_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_sl)
    wu_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_sl)
    sg_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], s_sl)
    su_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], s_sl)
    x0_s, x1_s, x2_s, x3_s = _activation_rings(STAGES, BLOCK_M, QK)
    return wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s


@gluon.jit
def _activation_rows(act_ptr, sorted_ids_ptr, pid_m, num_pairs, rows_per_pair, stride, BLOCK_M: gl.constexpr,
                     QK: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """Row pointers [BLOCK_M] of routing block pid_m's activations (row = pair // rows_per_pair) and the mask
    [BLOCK_M, QK] of its real pairs: padding is zero-filled, never read (read, every program would load row 0 at
    once: an L2 hot spot)."""
    xc_l: gl.constexpr = _copy_layout(QK, WARPS)
    cols = gl.arange(0, QK, layout=gl.SliceLayout(0, xc_l))
    pair = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, xc_l)))
    rows = act_ptr + gl.where(pair < num_pairs, pair // rows_per_pair, 0).to(gl.int64) * stride
    return rows, (pair < num_pairs)[:, None] & (cols < QK)[None, :]


@gluon.jit
def _copy_activations(x0_s, x1_s, x2_s, x3_s, slot, x_rows, x_ok, k0, QK: gl.constexpr, WARPS: gl.constexpr):
    """cp.async of a K step's four activation quarters into ring slot ``slot``: quarter q is columns
    k0 + 64g + 16q + j of the permuted K order, j < 16 (32 bytes: whole sectors, two threads' copies)."""
    x_cols = gl.arange(0, QK, layout=gl.SliceLayout(0, _copy_layout(QK, WARPS)))
    pos = x_rows[:, None] + (k0 + (x_cols // 16) * 64 + x_cols % 16)[None, :]
    cp.async_copy_global_to_shared(x0_s.index(slot), pos, mask=x_ok)
    cp.async_copy_global_to_shared(x1_s.index(slot), pos + 16, mask=x_ok)
    cp.async_copy_global_to_shared(x2_s.index(slot), pos + 32, mask=x_ok)
    cp.async_copy_global_to_shared(x3_s.index(slot), pos + 48, mask=x_ok)


@gluon.jit
def issue_gemm1_copies(
    wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s,  # the rings: packed gate, up; their scales; activation quarters
    slot,  # ring slot
    k0,  # the K step's first column
    wg_rows, wu_rows, sg_rows, su_rows,  # [BLOCK_N] row pointers: packed words, scale codes of gate and up
    x_rows,  # [BLOCK_M] activation row pointers
    w_cols, s_cols,  # column offsets of the weight and scale copies
    x_ok,  # [BLOCK_M, BLOCK_K / 4] real rows
    QK: gl.constexpr,  # packed words a row a K step
    WARPS: gl.constexpr,
):  # fmt: skip
    """cp.async of K step k0 into ring slot ``slot``."""
    cp.async_copy_global_to_shared(wg_s.index(slot), wg_rows[:, None] + (k0 // 4 + w_cols)[None, :])
    cp.async_copy_global_to_shared(wu_s.index(slot), wu_rows[:, None] + (k0 // 4 + w_cols)[None, :])
    cp.async_copy_global_to_shared(sg_s.index(slot), sg_rows[:, None] + (k0 // 16 + s_cols)[None, :])
    cp.async_copy_global_to_shared(su_s.index(slot), su_rows[:, None] + (k0 // 16 + s_cols)[None, :])
    _copy_activations(x0_s, x1_s, x2_s, x3_s, slot, x_rows, x_ok, k0, QK, WARPS)


@gluon.jit
def _gemm1_quarter(pg, pu, sg, su, xq, acc_g, acc_u, Q: gl.constexpr, LOOKAHEAD: gl.constexpr):
    """Quarter Q of a K step, gate and up: decode, issue the wgmma without waiting, then wait until at most
    LOOKAHEAD quarters (two wgmma groups each) are in flight. The registers of a quarter still in flight stay
    untouched because ptxas tracks the operands of asynchronous wgmmas (else it serializes them, with a warning)."""
    ag = _decode(pg, sg, Q)
    acc_g = warpgroup_mma(ag, xq, acc_g, is_async=True)
    au = _decode(pu, su, Q)
    acc_u = warpgroup_mma(au, xq, acc_u, is_async=True)
    acc_g, acc_u, ag, au = warpgroup_mma_wait(num_outstanding=2 * LOOKAHEAD, deps=(acc_g, acc_u, ag, au))
    return acc_g, acc_u


@gluon.jit
def _quarter(pw, sw, xq, acc, Q: gl.constexpr, LOOKAHEAD: gl.constexpr):
    """Quarter Q of one weight matrix's K step: decode, issue the wgmma, wait until at most LOOKAHEAD are in
    flight."""
    a = _decode(pw, sw, Q)
    acc = warpgroup_mma(a, xq, acc, is_async=True)
    acc, a = warpgroup_mma_wait(num_outstanding=LOOKAHEAD, deps=(acc, a))
    return acc


@gluon.jit
def _matrix_k_step(w_slot, s_slot, x0, x1, x2, x3, acc, BLOCK_N: gl.constexpr, QK: gl.constexpr,
                   LOOKAHEAD: gl.constexpr, a_l: gl.constexpr):  # fmt: skip
    """One weight matrix's K step from a ring slot (``w_slot``, ``s_slot``; ``x0`` .. ``x3``: the activation
    quarters, [QK, BLOCK_M] views): its packed words and scale codes into registers (operand layout ``a_l``), then
    the four quarters' wgmmas."""
    pw = w_slot.load(a_l)
    sw = _operand_scales(s_slot, BLOCK_N, QK, a_l)
    acc = _quarter(pw, sw, x0, acc, 0, LOOKAHEAD)
    acc = _quarter(pw, sw, x1, acc, 1, LOOKAHEAD)
    acc = _quarter(pw, sw, x2, acc, 2, LOOKAHEAD)
    return _quarter(pw, sw, x3, acc, 3, LOOKAHEAD)


@gluon.jit
def _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht):
    """h = SiLU(gate) * up, global scales and 2^7 (``nvfp4_decode.DECODE_UNSCALE``) applied, in the permuted K order of
    the kernel_wgmma layout (as ``nvfp4_moe``'s: column 64g + 16b + 8h + 4i + q at 64g + 16q + 8h + 2b + i)."""
    gs_gate = gl.load(wgs_ptr + e64 * stride_gse) * 128.0
    gs_up = gl.load(wgs_ptr + e64 * stride_gse + stride_gsg) * 128.0
    gate = acc_g * gs_gate
    h = gate / (1.0 + gl.exp(-gate)) * (acc_u * gs_up)
    col = (n // 64) * 64 + (n % 4) * 16 + ((n // 8) % 2) * 8 + ((n % 64) // 16) * 2 + (n // 4) % 2
    gl.store(h_ptr + pair_safe[None, :] * stride_ht + col[:, None], h.to(gl.bfloat16), mask=ok)


@gluon.jit
def gemm1_sources(x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m, pid_n, num_pairs, top_k, inter_size, stride_xt,
                  stride_we, stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, QK: gl.constexpr, SK: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """What gemm1's copies read, in the copy layouts of WARPS warps: row pointers [BLOCK_N] of the packed words and
    scale codes of gate and up (rows past I read row 0), their column offsets, the activation rows and their mask."""
    wc_l: gl.constexpr = _copy_layout(QK, WARPS)
    sc_l: gl.constexpr = _scale_copy_layout(WARPS)
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
    x_rows, x_ok = _activation_rows(x_ptr, sorted_ids_ptr, pid_m, num_pairs, top_k, stride_xt, BLOCK_M, QK, WARPS)
    return wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok


@gluon.jit
def gemm1_k_step(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, acc_g, acc_u, BLOCK_N: gl.constexpr,
                 QK: gl.constexpr, LOOKAHEAD: gl.constexpr, GATE_THEN_UP: gl.constexpr,
                 a_l: gl.constexpr):  # fmt: skip
    """One K step of gemm1 from ring slot ``slot`` (its copies landed), its wgmmas waited for: the accumulators."""
    if GATE_THEN_UP:  # one matrix's packed words and scales in registers at a time
        x0 = x0_s.index(slot).permute((1, 0))
        x1 = x1_s.index(slot).permute((1, 0))
        x2 = x2_s.index(slot).permute((1, 0))
        x3 = x3_s.index(slot).permute((1, 0))
        acc_g = _matrix_k_step(wg_s.index(slot), sg_s.index(slot), x0, x1, x2, x3, acc_g, BLOCK_N, QK, LOOKAHEAD, a_l)
        acc_u = _matrix_k_step(wu_s.index(slot), su_s.index(slot), x0, x1, x2, x3, acc_u, BLOCK_N, QK, LOOKAHEAD, a_l)
    else:
        pg = wg_s.index(slot).load(a_l)
        pu = wu_s.index(slot).load(a_l)
        sg = _operand_scales(sg_s.index(slot), BLOCK_N, QK, a_l)
        su = _operand_scales(su_s.index(slot), BLOCK_N, QK, a_l)
        acc_g, acc_u = _gemm1_quarter(pg, pu, sg, su, x0_s.index(slot).permute((1, 0)), acc_g, acc_u, 0,
                                      LOOKAHEAD)  # fmt: skip
        acc_g, acc_u = _gemm1_quarter(pg, pu, sg, su, x1_s.index(slot).permute((1, 0)), acc_g, acc_u, 1,
                                      LOOKAHEAD)  # fmt: skip
        acc_g, acc_u = _gemm1_quarter(pg, pu, sg, su, x2_s.index(slot).permute((1, 0)), acc_g, acc_u, 2,
                                      LOOKAHEAD)  # fmt: skip
        acc_g, acc_u = _gemm1_quarter(pg, pu, sg, su, x3_s.index(slot).permute((1, 0)), acc_g, acc_u, 3,
                                      LOOKAHEAD)  # fmt: skip
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))


@gluon.jit
def gemm1_finish(acc_g, acc_u, pid_m, pid_n, e64, wgs_ptr, sorted_ids_ptr, h_ptr, part_ptr, counter_ptr, ready_ptr,
                 num_pairs, inter_size, stride_gse, stride_gsg, stride_ht, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, WARPS: gl.constexpr, SPLITS: gl.constexpr, BLOCKS_LAST: gl.constexpr,
                 READY: gl.constexpr):  # fmt: skip
    """After the K loop: h of this program's tile (``_epilogue``), or with SPLITS its fp32 partials, the last program of
    the tile to arrive adding them in split order first; then the block's ready count (READY)."""
    mma: gl.constexpr = mma_layout(BLOCK_M, WARPS)
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
        cta_barrier()  # every thread's partials are written before the counter says so
        counter = counter_ptr + pid_m * gl.num_programs(0 if BLOCKS_LAST else 1) + pid_n
        if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            gl.store(counter, 0)  # ready for the next launch
            acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
            acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
            for split in gl.static_range(SPLITS):
                acc_g += gl.load(p_ptrs + split * split_stride, mask=ok, other=0.0, cache_modifier=".cg")
                acc_u += gl.load(p_ptrs + split * split_stride + inter_size, mask=ok, other=0.0,
                                 cache_modifier=".cg")  # fmt: skip
            _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht)
            _mark_ready(ready_ptr, pid_m, READY)
    else:
        _epilogue(acc_g, acc_u, n, ok, pair_safe, e64, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht)
        _mark_ready(ready_ptr, pid_m, READY)


@gluon.jit
def nvfp4_moe_gemm1_gluon_kernel(
    x_ptr,  # [T, H] bf16, prepared activations (the kernel_wgmma K order)
    w_ptr,  # [E, 2I, H/4] int16, packed codes (kernel_wgmma layout)
    ws_ptr,  # [E, 2I, H/16] uint8 scale codes
    wgs_ptr,  # [E, 2] fp32 global scales (gate, up), addressed by strides
    sorted_ids_ptr,  # [blocks * BLOCK_M] int32 pair ids, >= P = padding
    block_expert_ptr,  # [blocks] int32 expert of each block, -1 = no work
    h_ptr,  # [P, I] bf16 out, permuted K order
    part_ptr,  # [SPLITS, P, 2, I] fp32 partial sums of gate and up (SPLITS > 1), else unused
    counter_ptr,  # [blocks, N tiles] int32, zero on entry and left zero (SPLITS > 1), else unused
    ready_ptr,  # [blocks] int32, zero on entry: N tiles of h stored per block (READY), else unused
    num_pairs,  # P
    top_k,
    inter_size,  # I
    hidden_size,  # H, a multiple of BLOCK_K
    k_per_split,  # K columns per split, a multiple of BLOCK_K (SPLITS > 1)
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse, stride_gsg, stride_ht,
    gate_row0,  # first w13 row of the gate half: 0 ("gate_up") or I ("up_gate")
    up_row0,
    BLOCK_M: gl.constexpr,  # pairs a routing block (the wgmma's N): 16 at decode, up to 128 at prefill
    BLOCK_N: gl.constexpr,  # rows of gate (and of up) a program, a multiple of 16 * WARPS
    WARPS: gl.constexpr,  # the launch's num_warps: WARPS / 4 warp groups stacked along the rows
    BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr,  # copy ring depth
    LOOKAHEAD: gl.constexpr,  # quarters of wgmmas left in flight while the next is decoded
    GATE_THEN_UP: gl.constexpr,  # a K step's four gate quarters, then up's (else each quarter's gate and up)
    SPLITS: gl.constexpr,  # grid axis 2 splits K; the last program of a tile adds the partials in split order
    PDL: gl.constexpr,  # programmatic dependent launch
    BLOCKS_LAST: gl.constexpr,  # grid (N tiles, blocks, SPLITS): a block's N tiles side by side (prefill tiles)
    READY: gl.constexpr = False,  # count each block's stored N tiles in ready_ptr (moe_common.mark_block_ready)
):  # fmt: skip
    """Grid (blocks, N tiles, SPLITS), or (N tiles, blocks, SPLITS) with BLOCKS_LAST; WARPS warps. With READY the
    next launch may start once every program has started (gemm2 waits for each block's counter instead)."""
    QK: gl.constexpr = BLOCK_K // 4  # packed words a row a K step (4 codes each)
    SK: gl.constexpr = BLOCK_K // 16  # scale codes a row a K step
    pid_m, pid_n, expert = program_block(block_expert_ptr, PDL, BLOCKS_LAST)
    if PDL and READY:
        grid_dependency(False)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        mma: gl.constexpr = mma_layout(BLOCK_M, WARPS)
        a_l: gl.constexpr = operand_layout(BLOCK_M, WARPS)
        wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s = gemm1_rings(STAGES, BLOCK_M, BLOCK_N, QK, SK)

        wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = gemm1_sources(
            x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m, pid_n, num_pairs, top_k, inter_size, stride_xt, stride_we,
            stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M, BLOCK_N, QK, SK, WARPS)  # fmt: skip

        k_begin, steps = k_slice(hidden_size, k_per_split, BLOCK_K, SPLITS)
        for i in gl.static_range(STAGES - 1):
            if i < steps:
                issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, i, k_begin + i * BLOCK_K,
                                   wg_rows, wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, QK,
                                   WARPS)  # fmt: skip
            cp.commit_group()

        acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        for i in range(steps):
            slot = i % STAGES
            cp.wait_group(STAGES - 2)
            cta_barrier()  # every thread's copies of step i landed; every wgmma of step i - 1 was waited for
            nxt = i + STAGES - 1
            if nxt < steps:
                issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, nxt % STAGES,
                                   k_begin + nxt * BLOCK_K, wg_rows, wu_rows, sg_rows, su_rows, x_rows, w_cols,
                                   s_cols, x_ok, QK, WARPS)  # fmt: skip
            cp.commit_group()
            acc_g, acc_u = gemm1_k_step(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, acc_g, acc_u, BLOCK_N,
                                        QK, LOOKAHEAD, GATE_THEN_UP, a_l)  # fmt: skip
        cp.wait_group(0)
        if PDL and not READY:
            grid_dependency(False)

        gemm1_finish(acc_g, acc_u, pid_m, pid_n, e64, wgs_ptr, sorted_ids_ptr, h_ptr, part_ptr, counter_ptr, ready_ptr,
                     num_pairs, inter_size, stride_gse, stride_gsg, stride_ht, BLOCK_M, BLOCK_N, WARPS, SPLITS,
                     BLOCKS_LAST, READY)  # fmt: skip


@gluon.jit
def _tile_rows(w_base, s_base, tile, stride_wn, stride_sn, size, BLOCK_N: gl.constexpr, QK: gl.constexpr,
               WARPS: gl.constexpr):  # fmt: skip
    """Row pointers [BLOCK_N] of N tile ``tile``'s packed words and scale codes (rows past ``size`` read row 0), in
    the layouts of their copies: computed once a tile, the K step's offset added at each copy."""
    rows_w = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, _copy_layout(QK, WARPS)))
    rows_s = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, _scale_copy_layout(WARPS)))
    w_rows = w_base + gl.where(rows_w < size, rows_w, 0).to(gl.int64) * stride_wn
    return w_rows, s_base + gl.where(rows_s < size, rows_s, 0).to(gl.int64) * stride_sn


@gluon.jit
def _issue_gemm2_copies(
    w_s, s_s, x0_s, x1_s, x2_s, x3_s,  # the rings: packed words, scale codes, activation quarters
    slot,  # ring slot
    k0,  # the K step's first column
    w_rows, s_rows,  # [BLOCK_N] row pointers of the step's N tile (``_tile_rows``)
    x_rows, x_ok,  # [BLOCK_M] activation row pointers, [BLOCK_M, BLOCK_K / 4] real rows
    QK: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """cp.async of one step of gemm2 into ring slot ``slot``."""
    w_cols = gl.arange(0, QK, layout=gl.SliceLayout(0, _copy_layout(QK, WARPS)))
    s_cols = gl.arange(0, QK // 4, layout=gl.SliceLayout(0, _scale_copy_layout(WARPS)))
    cp.async_copy_global_to_shared(w_s.index(slot), w_rows[:, None] + (k0 // 4 + w_cols)[None, :])
    cp.async_copy_global_to_shared(s_s.index(slot), s_rows[:, None] + (k0 // 16 + s_cols)[None, :])
    _copy_activations(x0_s, x1_s, x2_s, x3_s, slot, x_rows, x_ok, k0, QK, WARPS)


@gluon.jit
def _gemm2_rings(STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, QK: gl.constexpr,
                 SK: gl.constexpr):  # fmt: skip
    """gemm2's STAGES-deep rings: packed words [STAGES, BLOCK_N, QK] int16, scale codes [STAGES, BLOCK_N, SK] uint8,
    and the four activation quarters (``_activation_rings``)."""
    w_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_N, QK], gl.int16))  # fmt: skip
    s_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x0_s, x1_s, x2_s, x3_s = _activation_rings(STAGES, BLOCK_M, QK)
    return w_s, s_s, x0_s, x1_s, x2_s, x3_s


@gluon.jit
def _gemm2_pairs(sorted_ids_ptr, topk_weights_ptr, wgs_ptr, e64, pid_m, num_pairs, BLOCK_M: gl.constexpr,
                 mma: gl.constexpr):  # fmt: skip
    """Routing block pid_m's pairs in the accumulators' layout: which are real, their ids (padding at 0, int64), and
    each one's output scale (global scale * 2^7 * top-k weight)."""
    pair_o = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma)))
    pair_ok = pair_o < num_pairs
    pair_safe = gl.where(pair_ok, pair_o, 0).to(gl.int64)
    # DECODE_UNSCALE = 2^7
    scale = gl.load(wgs_ptr + e64) * 128.0 * gl.load(topk_weights_ptr + pair_safe, mask=pair_ok, other=0.0)
    return pair_ok, pair_safe, scale


@gluon.jit
def _gemm2_k_step(w_s, s_s, x0_s, x1_s, x2_s, x3_s, slot, acc, BLOCK_N: gl.constexpr, QK: gl.constexpr,
                  LOOKAHEAD: gl.constexpr, a_l: gl.constexpr):  # fmt: skip
    """One K step of gemm2 from ring slot ``slot`` (its copies landed), its wgmmas waited for: the accumulator."""
    acc = _matrix_k_step(w_s.index(slot), s_s.index(slot), x0_s.index(slot).permute((1, 0)),
                         x1_s.index(slot).permute((1, 0)), x2_s.index(slot).permute((1, 0)),
                         x3_s.index(slot).permute((1, 0)), acc, BLOCK_N, QK, LOOKAHEAD, a_l)  # fmt: skip
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _gemm2_store(acc, tile, scale, pair_ok, pair_safe, y_ptr, hidden_size, stride_yt, BLOCK_N: gl.constexpr,
                 mma: gl.constexpr):  # fmt: skip
    """N tile ``tile`` of y: the accumulator times each pair's scale (``_gemm2_pairs``), in y's dtype."""
    n = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    y = (acc * scale[None, :]).to(y_ptr.dtype.element_ty)
    gl.store(y_ptr + pair_safe[None, :] * stride_yt + n[:, None], y, mask=pair_ok[None, :] & (n < hidden_size)[:, None])


@gluon.jit
def nvfp4_moe_gemm2_gluon_kernel(
    h_ptr,  # [P, I] bf16 from gemm1 (the kernel_wgmma K order)
    w_ptr,  # [E, H, I/4] int16, packed codes (kernel_wgmma layout)
    ws_ptr,  # [E, H, I/16] uint8 scale codes
    wgs_ptr,  # [E] fp32 global scales
    topk_weights_ptr,  # [P] fp32, flattened [T, k]
    sorted_ids_ptr,  # [blocks * BLOCK_M] int32 pair ids, >= P = padding
    block_expert_ptr,  # [blocks] int32 expert of each block, -1 = no work
    y_ptr,  # [P, H] out (the hidden states' dtype); with SPLITS > 1 [SPLITS, P, H] fp32 partials
    num_pairs,  # P
    hidden_size,  # H (this GEMM's N)
    inter_size,  # I (its K), a multiple of BLOCK_K
    k_per_split,  # K columns per split, a multiple of BLOCK_K (SPLITS > 1)
    stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_yt,
    BLOCK_M: gl.constexpr,  # pairs a routing block (the wgmma's N): 16 at decode, up to 128 at prefill
    BLOCK_N: gl.constexpr,  # weight rows (output columns) a tile, a multiple of 16 * WARPS
    WARPS: gl.constexpr,  # the launch's num_warps: WARPS / 4 warp groups stacked along the rows
    BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr,  # copy ring depth
    LOOKAHEAD: gl.constexpr,  # quarters of wgmmas left in flight while the next is decoded
    SPLITS: gl.constexpr,  # grid axis 2 splits K (one N tile a program); the top-k sum adds the partials in order
    PDL: gl.constexpr,  # programmatic dependent launch
):  # fmt: skip
    """Grid (blocks, N programs, SPLITS), WARPS warps. Program n computes N tiles n, n + programs, ... in one pipelined
    loop over (tile, K step) steps (TP8's I = 256 is one K step: the next tile's copies overlap this one's decode);
    y = W2[e] h * global scale * 2^7 * top-k weight, as ``nvfp4_moe.nvfp4_moe_gemm2_kernel`` computes it."""
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    pid_m, pid_n, expert = program_block(block_expert_ptr, PDL)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        mma: gl.constexpr = mma_layout(BLOCK_M, WARPS)
        w_s, s_s, x0_s, x1_s, x2_s, x3_s = _gemm2_rings(STAGES, BLOCK_M, BLOCK_N, QK, SK)
        w_base = w_ptr + e64 * stride_we
        s_base = ws_ptr + e64 * stride_se
        x_rows, x_ok = _activation_rows(h_ptr, sorted_ids_ptr, pid_m, num_pairs, 1, stride_ht, BLOCK_M, QK, WARPS)

        k_begin, k_steps = k_slice(inter_size, k_per_split, BLOCK_K, SPLITS)
        if SPLITS > 1:
            y_ptr += gl.program_id(2).to(gl.int64) * num_pairs * stride_yt
        programs = gl.num_programs(1)
        steps = gl.cdiv(gl.cdiv(hidden_size, BLOCK_N) - pid_n, programs) * k_steps
        # the row pointers of the tile whose copies are issued next (STAGES - 1 steps ahead of the one computed)
        w_rows, s_rows = _tile_rows(w_base, s_base, pid_n, stride_wn, stride_sn, hidden_size, BLOCK_N, QK, WARPS)
        for i in gl.static_range(STAGES - 1):
            if i < steps:
                if i > 0 and i % k_steps == 0:  # a tile's first step
                    w_rows, s_rows = _tile_rows(w_base, s_base, pid_n + (i // k_steps) * programs, stride_wn,
                                                stride_sn, hidden_size, BLOCK_N, QK, WARPS)  # fmt: skip
                _issue_gemm2_copies(w_s, s_s, x0_s, x1_s, x2_s, x3_s, i, k_begin + (i % k_steps) * BLOCK_K, w_rows,
                                    s_rows, x_rows, x_ok, QK, WARPS)  # fmt: skip
            cp.commit_group()

        pair_ok, pair_safe, scale = _gemm2_pairs(sorted_ids_ptr, topk_weights_ptr, wgs_ptr, e64, pid_m, num_pairs,
                                                 BLOCK_M, mma)  # fmt: skip
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        for i in range(steps):
            slot = i % STAGES
            cp.wait_group(STAGES - 2)
            cta_barrier()  # every thread's copies of step i landed; every wgmma of step i - 1 was waited for
            nxt = i + STAGES - 1
            if nxt < steps:
                k_nxt = nxt % k_steps
                if k_nxt == 0:  # a tile's first step
                    w_rows, s_rows = _tile_rows(w_base, s_base, pid_n + (nxt // k_steps) * programs, stride_wn,
                                                stride_sn, hidden_size, BLOCK_N, QK, WARPS)  # fmt: skip
                _issue_gemm2_copies(w_s, s_s, x0_s, x1_s, x2_s, x3_s, nxt % STAGES, k_begin + k_nxt * BLOCK_K,
                                    w_rows, s_rows, x_rows, x_ok, QK, WARPS)  # fmt: skip
            cp.commit_group()
            acc = _gemm2_k_step(w_s, s_s, x0_s, x1_s, x2_s, x3_s, slot, acc, BLOCK_N, QK, LOOKAHEAD,
                                operand_layout(BLOCK_M, WARPS))  # fmt: skip
            if i % k_steps == k_steps - 1:  # the tile's last K step: store it, start the next
                _gemm2_store(acc, pid_n + (i // k_steps) * programs, scale, pair_ok, pair_safe, y_ptr, hidden_size,
                             stride_yt, BLOCK_N, mma)  # fmt: skip
                acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        cp.wait_group(0)
        if PDL:
            grid_dependency(False)


def grid(num_blocks: int, n_size: int, block_n: int, splits: int, per_program: int = 1) -> tuple[int, int, int]:
    """The launch grid: a program per possible block, N tile (or group of ``per_program`` tiles) and K split."""
    return num_blocks, cdiv(cdiv(n_size, block_n), per_program), splits
