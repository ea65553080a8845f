"""gemm1 of the W4A16 op for sm_90 in Gluon with its copies on a warp group of their own (warp specialization).

The same kernel as ``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel`` (the same arguments, grid, ring, decode, quarter
wgmmas in the same order, epilogue and split sums, through that module's helpers, so the same bits), split in two
partitions:

- the producer, PRODUCER_WARPS warps (a warp group) at PRODUCER_REGS registers a thread (``setmaxnreg``), computes the
  row pointers from the routing and issues each K step's cp.async copies into its ring slot once the slot's ``empty``
  mbarrier says the consumers are done with it; each of its threads arrives on the slot's ``full`` mbarrier when its
  copies land (``cp.async.mbarrier.arrive.noinc``), so no thread waits on a copy group;
- the consumers (the launch's WARPS warps, the rest of the registers) wait on ``full``, decode and multiply the slot
  and release it (a barrier of their warps, then one arrival on ``empty``); the epilogue follows in the launch's
  warps.

The producer fills all STAGES slots ahead (the copy-issuing kernel refills the slot just consumed, STAGES - 1 ahead).
The launch's register cap (``maxnreg``) times its WARPS + PRODUCER_WARPS warps is the CTA's budget: the producer takes
PRODUCER_REGS a thread and the consumers the rest (``variants/w4a16_gluon.py``, ``PRODUCER_FORMS``).
On the H200, the whole op at real routing: the same bits as the copy-issuing kernel at every GLM-5 step B = 2-256;
faster only where a program has an SM to itself (TP8 B = 7-8, one program per SM: 0.974-0.978x the op).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from sglang_glm5.kernels import nvfp4_moe_gluon as g

CONSUMER_LOOKAHEAD = gl.constexpr(1)  # quarters of wgmmas in flight while the next is decoded (the op's LOOKAHEAD)


@gluon.jit
def ws_barriers(STAGES: gl.constexpr, PRODUCER_WARPS: gl.constexpr):
    """A ring's ``full`` and ``empty`` mbarriers, one a slot: every producer thread arrives on ``full`` when its copies
    land; one consumer thread arrives on ``empty``, after a barrier of the consumers' warps."""
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(full.index(b), count=32 * PRODUCER_WARPS)
        mbarrier.init(empty.index(b), count=1)
    return full, empty


@gluon.jit
def release_slot(empty, slot):
    """The consumers are done with ``slot``: a barrier of their warps, then one arrival on its ``empty``."""
    g.cta_barrier()  # a barrier of this partition's warps
    mbarrier.arrive(empty.index(slot))


@gluon.jit
def consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, GATE_THEN_UP: gl.constexpr):
    """The default partition's K loop: the shipped K step on each slot once ``full`` says it landed, then ``empty``.
    Returns the accumulators of gate and up. (A partition's arguments reach it as values, not constexprs: the tile's
    sizes come from the rings' shapes and the partition's warps.)"""
    STAGES: gl.constexpr = wg_s.shape[0]
    BLOCK_N: gl.constexpr = wg_s.shape[1]
    QK: gl.constexpr = wg_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = g.mma_layout(BLOCK_M, WARPS)
    a_l: gl.constexpr = g.operand_layout(BLOCK_M, WARPS)
    acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(full.index(slot), (i // STAGES) & 1)
        acc_g, acc_u = g.gemm1_k_step(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, acc_g, acc_u, BLOCK_N, QK,
                                      CONSUMER_LOOKAHEAD, GATE_THEN_UP, a_l)  # fmt: skip
        release_slot(empty, slot)
    return acc_g, acc_u


@gluon.jit
def _consume_interleaved(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps):
    return consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, False)


@gluon.jit
def _consume_gate_then_up(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps):
    return consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, True)


@gluon.jit
def produce(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr,
            e64, pid_m, pid_n, num_pairs, top_k, inter_size, k_begin, steps, stride_xt, stride_we, stride_wn,
            stride_se, stride_sn, gate_row0, up_row0):  # fmt: skip
    """The worker partition: the row pointers (as the shipped kernel builds them, in its copy layouts on this
    partition's warps), then each K step's copies into its slot once ``empty`` frees it, arriving on ``full``."""
    STAGES: gl.constexpr = wg_s.shape[0]
    BLOCK_N: gl.constexpr = wg_s.shape[1]
    QK: gl.constexpr = wg_s.shape[2]
    SK: gl.constexpr = sg_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    PRODUCER_WARPS: gl.constexpr = gl.num_warps()
    wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = g.gemm1_sources(
        x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m, pid_n, num_pairs, top_k, inter_size, stride_xt, stride_we,
        stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M, BLOCK_N, QK, SK, PRODUCER_WARPS)  # fmt: skip
    for i in range(steps):
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), ((i // STAGES) - 1) & 1)
        g.issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, k_begin + i * 4 * QK, wg_rows,
                             wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, QK,
                             PRODUCER_WARPS)  # fmt: skip
        cp.mbarrier_arrive(full.index(slot), increment_count=False)  # this thread's arrival, once its copies land


@gluon.jit
def nvfp4_moe_gemm1_ws_kernel(
    x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, block_expert_ptr, h_ptr, part_ptr, counter_ptr, ready_ptr,
    num_pairs, top_k, inter_size, hidden_size, k_per_split,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse, stride_gsg, stride_ht, gate_row0, up_row0,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOOKAHEAD: gl.constexpr, GATE_THEN_UP: gl.constexpr, SPLITS: gl.constexpr, PDL: gl.constexpr,
    BLOCKS_LAST: gl.constexpr, READY: gl.constexpr = False,
    PRODUCER_WARPS: gl.constexpr = 4,  # the copying partition's warps (a warp group: setmaxnreg works on those)
    PRODUCER_REGS: gl.constexpr = 48,  # its registers a thread
):  # fmt: skip
    """``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel``'s arguments, grid and results; WARPS consumer warps (the
    launch's num_warps) and PRODUCER_WARPS more."""
    gl.static_assert(LOOKAHEAD == CONSUMER_LOOKAHEAD, "the consumers keep CONSUMER_LOOKAHEAD quarters in flight")
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    pid_m, pid_n, expert = g.program_block(block_expert_ptr, PDL, BLOCKS_LAST)
    if PDL and READY:
        g.grid_dependency(False)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s = g.gemm1_rings(STAGES, BLOCK_M, BLOCK_N, QK, SK)
        full, empty = ws_barriers(STAGES, PRODUCER_WARPS)

        k_begin, steps = g.k_slice(hidden_size, k_per_split, BLOCK_K, SPLITS)
        consumer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps)
        producer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr,
                    e64, pid_m, pid_n, num_pairs, top_k, inter_size, k_begin, steps, stride_xt, stride_we,
                    stride_wn, stride_se, stride_sn, gate_row0, up_row0)  # fmt: skip
        if GATE_THEN_UP:
            acc_g, acc_u = gl.warp_specialize([(_consume_gate_then_up, consumer), (produce, producer)],
                                              [PRODUCER_WARPS], [PRODUCER_REGS])  # fmt: skip
        else:
            acc_g, acc_u = gl.warp_specialize([(_consume_interleaved, consumer), (produce, producer)],
                                              [PRODUCER_WARPS], [PRODUCER_REGS])  # fmt: skip
        if PDL and not READY:
            g.grid_dependency(False)

        g.gemm1_finish(acc_g, acc_u, pid_m, pid_n, e64, wgs_ptr, sorted_ids_ptr, h_ptr, part_ptr, counter_ptr,
                       ready_ptr, num_pairs, inter_size, stride_gse, stride_gsg, stride_ht, BLOCK_M, BLOCK_N, WARPS,
                       SPLITS, BLOCKS_LAST, READY)  # fmt: skip
