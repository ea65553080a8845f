"""Triton kernels of the NVFP4 (W4A16) fused-MoE path.

Data flow (P = T * top_k (token, slot) pairs, sorted by expert into blocks of BLOCK_M pairs that
share one expert; ``sorted_ids`` holds pair ids, ``num_pairs`` marks padding):

    route:   sorted_ids, block_expert, used blocks; xp[t, :] = x[t], K order permuted     (one launch)
    gemm1:   hp[p, :]  = silu(Wg[e] @ x[p // k]) * (Wu[e] @ x[p // k]), as xp            -> [P, I]
    gemm2:   y[p, :]   = topk_weight[p] * (W2[e] @ h[p])                                 -> [P, H]
    reduce:  out[t, :] = sum over slots j with topk_ids[t, j] valid of y[t * k + j]      -> [T, H]

At decode few experts are active, so both GEMMs may split K over a grid axis (SPLITS): gemm1's last
program of a tile adds the fp32 partials in split order and applies SiLU * up; gemm2's fp32
partials [SPLITS, P, H] are added by the reduce, slots then splits (``docs/decode.md``). Where gemm2 walks several
N tiles a program, gemm1 counts each block's stored tiles of h (READY) and gemm2's programs wait for their block's
count rather than for the whole of gemm1 (``mark_block_ready``, ``await_block``).

Activations, h and the decoded weights share one 16-bit type, that of the hidden states (bf16 or
fp16): the tensor cores multiply it and accumulate in fp32.

The GEMMs compute C^T = W @ X^T: the decoded weight tile [BLOCK_N, BLOCK_K] is the left operand,
in the K-contiguous layout the tensor cores want for it, and the pairs are the narrow right operand
(BLOCK_M = 16 at decode). On Hopper the decoded weights then feed wgmma from registers: the packed
bytes go global -> shared (cp.async) -> registers and are never written back as 16-bit values.

Packed weights are read as 16-bit words: word c of a row holds K elements 4c .. 4c + 3, one per
nibble (element 2i in the low nibble of byte i). Instead of interleaving the nibbles back into one
tile, each K step does four quarter-width dots: nibble q of every word against activation columns
4c + q (a dot product does not care in which order K is summed). To make those activation loads
contiguous, activations are stored with each group of 32 K columns permuted to
[0, 4, ..., 28, 1, 5, ..., 29, 2, ..., 30, 3, ..., 31]: columns 4c + q of a group are 8 adjacent
values, one 16-byte load (``nvfp4_route.prepare_activations_kernel`` for x; gemm1 writes h that way). Weights in the
"kernel_wgmma" layout (LAYOUT 2) hold in word slot 8h + 2b + i of each 16 the word 4b + 2h + i, so the
activations follow in a K order of period 64: column 64g + 16b + 8h + 4i + q at 64g + 16q + 8h + 2b + i
(``_permuted_column``), so that a quarter's columns of a group are 16 adjacent values: whole 32-byte sectors
(runs of 8 fetch every sector of the row twice, once for each of two quarters' 16-byte halves).

The weight decode and the four quarter-width dots of a K step are ``nvfp4_decode``'s; the routing sort, the
activations' permutation and the top-k sum are ``nvfp4_route``'s.

``INTERPRETER`` works around faults of the Triton interpreter (TRITON_INTERPRET=1, used by the
CPU tests): inline PTX cannot run there, so the decode is the same arithmetic in Triton ops; bf16
dots compute wrongly (triton issue #11584), so both dot operands are upcast to fp32; and its
fp32 -> bf16 cast truncates, so bf16 results are rounded to nearest-even by hand.
"""

import triton
import triton.language as tl

from sglang_glm5.kernels.moe_common import (
    after_previous_launch,
    await_block,
    block_pairs,
    expert_rows,
    let_next_launch,
    mark_block_ready,
    round_to,
    tile_columns,
)
from sglang_glm5.kernels.nvfp4_decode import load_quarters, nvfp4_dot


@triton.jit
def _permuted_column(n, WGMMA: tl.constexpr):
    """Position of K column n in the permuted activation layout (``permute_activation_tile``)."""
    if WGMMA:
        return (n // 64) * 64 + (n % 4) * 16 + ((n // 8) % 2) * 8 + ((n % 64) // 16) * 2 + (n // 4) % 2
    else:
        return (n // 32) * 32 + (n % 4) * 8 + (n % 32) // 4


@triton.jit
def _pid(role: tl.constexpr, BLOCKS_LAST: tl.constexpr):
    """This program's routing block (role 0), N tile (1) or K split (2): grid axes 0, 1, 2, or with BLOCKS_LAST
    2, 0, 1, so that the programs of the first blocks (the used ones) launch before those of the blocks after."""
    return tl.program_id((role + 2) % 3 if BLOCKS_LAST else role)


@triton.jit
def _nprog(role: tl.constexpr, BLOCKS_LAST: tl.constexpr):
    """The grid's extent along ``_pid``'s role."""
    return tl.num_programs((role + 2) % 3 if BLOCKS_LAST else role)


@triton.jit
def _split_range(K, k_per_split, SPLIT_K: tl.constexpr, BLOCKS_LAST: tl.constexpr):
    """[k_begin, k_end) of this program's K slice (the split axis when SPLIT_K, else all of K)."""
    if SPLIT_K:
        k_begin = _pid(2, BLOCKS_LAST) * k_per_split
        return k_begin, tl.minimum(k_begin + k_per_split, K)
    else:
        return 0, K


@triton.jit
def nvfp4_moe_gemm1_kernel(
    x_ptr,  # [T, H] bf16/fp16, prepared activations (permuted K order)
    w_ptr,  # [E, 2I, H/4] int16, packed e2m1 (the uint8 [E, 2I, H/2] tensor viewed as int16)
    ws_ptr,  # [E, 2I, H/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E, 2] fp32 global scales (gate, up), addressed by strides
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32 expert of each block, -1 = no work
    used_blocks_ptr,  # [1] int32: the blocks that hold pairs are 0 .. used - 1
    part_ptr,  # [SPLITS, P, 2, I] fp32 partial sums of gate and up (SPLITS > 1); STREAM: _gemm1_stream's; else unused
    counter_ptr,  # [num_blocks, N tiles] int32, zero on entry and left zero (SPLITS > 1 or STREAM), else unused
    ready_ptr,  # [num_blocks] int32, zero on entry: N tiles of h stored per block (READY), else unused
    h_ptr,  # [P, I] out, dtype of x: h in the permuted K order, gemm2's activations
    num_pairs,  # P = T * top_k
    top_k,
    inter_size,  # I
    hidden_size,  # H (the K of this GEMM)
    k_per_split,  # K elements per split, a multiple of BLOCK_K (SPLITS > 1)
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_gsg,  # 0 when one global scale serves gate and up
    stride_ht,
    gate_row0,  # first w13 row of the gate half: 0 ("gate_up") or I ("up_gate")
    up_row0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # hidden_size % BLOCK_K == 0: no K masks
    SPLITS: tl.constexpr,  # the split axis (_pid) splits K in SPLITS; the last program of a tile to finish adds them
    BLOCK_LOOP: tl.constexpr,  # fewer block programs than possible blocks: each walks the used blocks
    LAYOUT: tl.constexpr,  # the weights' layout: 0 the checkpoint's, 1 kernel, 2 kernel_wgmma (nvfp4.LAYOUTS)
    INTERPRETER: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (after_previous_launch, let_next_launch)
    BLOCKS_LAST: tl.constexpr = False,  # grid (N tiles, K splits, block programs) instead (_pid)
    STREAM: tl.constexpr = False,  # grid (programs,): each walks an equal share of all (block, tile, K step)s
    READY: tl.constexpr = False,  # count each block's stored N tiles in ready_ptr (mark_block_ready; not STREAM)
):
    """Grid (block programs, N tiles, K splits). With BLOCK_LOOP, block program b walks the used routing blocks
    b, b + programs, ..., so the grid can be sized for the work expected rather than for the upper
    bound on blocks, and idle programs cost one load. With SPLITS > 1, each program writes its fp32
    partial sums; the last to arrive at a (block, tile) counter (an integer atomic) adds the partials
    in split order, so the result does not depend on which program that is, and applies SiLU * up.

    With STREAM (a stream-K schedule, ``_gemm1_stream``) the grid is a number of persistent programs that share the
    work of the used blocks equally, whatever the number of blocks: no program count to plan from expected blocks,
    no tail wave.

    With READY, gemm2's programs of a block wait for its counter, not for the whole launch: the next launch may then
    start as soon as every program of this one has started (``let_next_launch`` at the start)."""
    after_previous_launch(PDL)
    if READY:
        let_next_launch(PDL)
    if STREAM:
        _gemm1_stream(
            x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, part_ptr, counter_ptr,
            h_ptr, num_pairs, top_k, inter_size, hidden_size, stride_xt, stride_we, stride_wn, stride_se, stride_sn,
            stride_gse, stride_gsg, stride_ht, gate_row0, up_row0, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, LAYOUT,
            INTERPRETER, PDL,
        )  # fmt: skip
    elif BLOCK_LOOP:
        for pid_m in range(_pid(0, BLOCKS_LAST), tl.load(used_blocks_ptr), _nprog(0, BLOCKS_LAST)):
            _gemm1_block(
                pid_m, tl.load(block_expert_ptr + pid_m),
                x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, part_ptr, counter_ptr, ready_ptr, h_ptr, num_pairs,
                top_k, inter_size, hidden_size, k_per_split, stride_xt, stride_we, stride_wn, stride_se, stride_sn,
                stride_gse, stride_gsg, stride_ht, gate_row0, up_row0, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SPLITS,
                LAYOUT, INTERPRETER, PDL, BLOCKS_LAST, READY,
            )  # fmt: skip
    else:  # a program per possible block: the unused ones (expert -1) have nothing to do
        expert = tl.load(block_expert_ptr + _pid(0, BLOCKS_LAST))
        if expert >= 0:
            _gemm1_block(
                _pid(0, BLOCKS_LAST), expert,
                x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, part_ptr, counter_ptr, ready_ptr, h_ptr, num_pairs,
                top_k, inter_size, hidden_size, k_per_split, stride_xt, stride_we, stride_wn, stride_se, stride_sn,
                stride_gse, stride_gsg, stride_ht, gate_row0, up_row0, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SPLITS,
                LAYOUT, INTERPRETER, PDL, BLOCKS_LAST, READY,
            )  # fmt: skip


@triton.jit
def _gemm1_accumulate(
    pid_m,  # the routing block
    expert,  # its expert (int64)
    pid_n,  # the N tile
    k_begin,  # the K slice [k_begin, k_end), whole K steps (k_end may be K)
    k_end,
    x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, num_pairs, top_k, inter_size, hidden_size, stride_xt, stride_we, stride_wn,
    stride_se, stride_sn, gate_row0, up_row0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    LAYOUT: tl.constexpr, INTERPRETER: tl.constexpr,
):  # fmt: skip
    """Gate and up of N tile pid_n for block pid_m over one K slice -> (acc_g, acc_u) [BLOCK_N, BLOCK_M] fp32, and the
    tile's rows and columns as ``block_pairs`` and ``tile_columns`` give them (row_ok, pair_safe, offs_n, n_ok,
    offs_n_safe)."""
    offs_n, n_ok, offs_n_safe = tile_columns(pid_n, inter_size, BLOCK_N)
    pair, row_ok, pair_safe = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)
    wg_rows, sg_rows = expert_rows(w_ptr, ws_ptr, expert, gate_row0 + offs_n_safe, stride_we, stride_wn, stride_se,
                                   stride_sn)  # fmt: skip
    wu_rows, su_rows = expert_rows(w_ptr, ws_ptr, expert, up_row0 + offs_n_safe, stride_we, stride_wn, stride_se,
                                   stride_sn)  # fmt: skip

    x_rows = x_ptr + token * stride_xt
    acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # The K loop runs at least once: without this the compiled loop keeps a zero-trip path that sets
    # the accumulators by plain moves while wgmma may be in flight, and ptxas serializes every wgmma
    # (warning C7515; up to 25% slower on the H200, depending on the tile).
    tl.assume(k_end > k_begin)
    for k0 in range(k_begin, k_end, BLOCK_K):
        x0, x1, x2, x3 = load_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
        acc_g = nvfp4_dot(
            acc_g, wg_rows, sg_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER
        )
        acc_u = nvfp4_dot(
            acc_u, wu_rows, su_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER
        )
    return acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, offs_n_safe


@triton.jit
def _gemm1_epilogue(
    acc_g,  # [BLOCK_N, BLOCK_M] fp32, the full-K sums of gate
    acc_u,  # and of up
    row_ok, pair_safe, offs_n, n_ok,  # the tile's rows and columns (_gemm1_accumulate)
    expert, wgs_ptr, h_ptr, stride_gse, stride_gsg, stride_ht, LAYOUT: tl.constexpr, INTERPRETER: tl.constexpr,
):  # fmt: skip
    """h = SiLU(gate) * up for the block's pairs (global scales applied), stored in the permuted K order."""
    gs_gate = tl.load(wgs_ptr + expert * stride_gse) * 128.0  # DECODE_UNSCALE = 2^7
    gs_up = tl.load(wgs_ptr + expert * stride_gse + stride_gsg) * 128.0
    gate = acc_g * gs_gate
    up = acc_u * gs_up
    h = gate / (1.0 + tl.exp(-gate)) * up
    h_ptrs = h_ptr + pair_safe[None, :] * stride_ht + _permuted_column(offs_n, LAYOUT == 2)[:, None]
    tl.store(h_ptrs, round_to(h, h_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[None, :] & n_ok[:, None])


@triton.jit
def _gemm1_block(
    pid_m,  # the routing block
    expert,  # its expert
    x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, part_ptr, counter_ptr, ready_ptr, h_ptr, num_pairs, top_k,
    inter_size, hidden_size, k_per_split, stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse, stride_gsg,
    stride_ht, gate_row0, up_row0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SPLITS: tl.constexpr,
    LAYOUT: tl.constexpr, INTERPRETER: tl.constexpr, PDL: tl.constexpr, BLOCKS_LAST: tl.constexpr,
    READY: tl.constexpr,
):  # fmt: skip
    """gemm1 for routing block pid_m, N tile program_id(1), K split program_id(2) (the kernel's arguments)."""
    pid_n = _pid(1, BLOCKS_LAST)
    k_begin, k_end = _split_range(hidden_size, k_per_split, SPLITS > 1, BLOCKS_LAST)
    expert = expert.to(tl.int64)
    acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, offs_n_safe = _gemm1_accumulate(
        pid_m, expert, pid_n, k_begin, k_end, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, num_pairs, top_k, inter_size,
        hidden_size, stride_xt, stride_we, stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M, BLOCK_N,
        BLOCK_K, EVEN_K, LAYOUT, INTERPRETER,
    )  # fmt: skip
    if not READY:
        let_next_launch(PDL)

    last = True
    if SPLITS > 1:
        # part[s, p, 0, n] = gate, part[s, p, 1, n] = up
        split_stride = num_pairs * 2 * inter_size
        p_ptrs = part_ptr + pair_safe[None, :] * (2 * inter_size) + offs_n_safe[:, None]
        mask = row_ok[None, :] & n_ok[:, None]
        tl.store(p_ptrs + _pid(2, BLOCKS_LAST) * split_stride, acc_g, mask=mask)
        tl.store(p_ptrs + _pid(2, BLOCKS_LAST) * split_stride + inter_size, acc_u, mask=mask)
        tl.debug_barrier()  # every thread's partials are written before the counter says so
        arrived = tl.atomic_add(counter_ptr + pid_m * _nprog(1, BLOCKS_LAST) + pid_n, 1, sem="acq_rel", scope="gpu")
        last = arrived == SPLITS - 1
        if last:
            tl.store(counter_ptr + pid_m * _nprog(1, BLOCKS_LAST) + pid_n, 0)  # ready for a launch without a route
            # Unrolled, so that all SPLITS loads are in flight together; added in split order.
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for split in tl.static_range(SPLITS):
                acc_g += tl.load(p_ptrs + split * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
                acc_u += tl.load(p_ptrs + split * split_stride + inter_size, mask=mask, other=0.0,
                                 cache_modifier=".cg")  # fmt: skip
    if last:
        _gemm1_epilogue(acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, expert, wgs_ptr, h_ptr, stride_gse, stride_gsg,
                        stride_ht, LAYOUT, INTERPRETER)  # fmt: skip
        mark_block_ready(ready_ptr, pid_m, READY)


# Partial tiles the last program of a stream-K tile loads at a time (``_gemm1_stream``).
STREAM_GROUP = tl.constexpr(4)


@triton.jit
def _stream_start(p, total, programs):
    """The first work unit of program p's share in a stream-K schedule of ``programs`` over ``total`` units."""
    return p * total // programs


@triton.jit
def _stream_owner(unit, total, programs):
    """The program of a stream-K schedule whose share holds work unit ``unit``: program p does units
    [p * total // programs, (p + 1) * total // programs)."""
    return ((unit + 1) * programs - 1) // total


@triton.jit
def _gemm1_stream(
    x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, part_ptr, counter_ptr, h_ptr,
    num_pairs, top_k, inter_size, hidden_size, stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse,
    stride_gsg, stride_ht, gate_row0, up_row0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, LAYOUT: tl.constexpr,
    INTERPRETER: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """gemm1 as a stream-K schedule. The work units are the K steps of every (used block, N tile), tile-major:
    unit u is K step u % steps of tile u // steps (block tile // N tiles, N tile tile % N tiles). Program p walks
    units [p * total // programs, (p + 1) * total // programs) in segments that end at tile boundaries (with at most
    ``total`` programs: the rest have none, so that every program has at least one unit). A segment
    that is a whole tile writes h itself. Otherwise the segment's fp32 sums go to the program's partial slot
    (part[p, 0] for its first segment, part[p, 1] for its last: the only two that can be partial), and the last
    program to arrive at the tile's counter (an integer atomic) adds the tile's partials in program order, which is
    K order, and writes h: the result depends on the number of used blocks and programs, not on timing."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(inter_size, BLOCK_N)
    steps = tl.cdiv(hidden_size, BLOCK_K)
    total = tl.load(used_blocks_ptr) * (tiles_n * steps)
    # at most one program per unit, so that every program of a tile's range has a part of it (the counter's count)
    programs = tl.maximum(tl.minimum(tl.num_programs(0), total), 1)
    start = _stream_start(tl.minimum(pid, programs), total, programs)
    end = _stream_start(tl.minimum(pid + 1, programs), total, programs)  # programs past the units: start = end
    # part[p, kind, 0] = gate, part[p, kind, 1] = up: [BLOCK_N, BLOCK_M] fp32 each, whole tiles
    tile_elems: tl.constexpr = BLOCK_N * BLOCK_M
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    unit = start
    while unit < end:
        tile = unit // steps
        tile_first = tile * steps
        seg_end = tl.minimum(end, tile_first + steps)
        pid_m = tile // tiles_n
        pid_n = tile % tiles_n
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        k_begin = (unit - tile_first) * BLOCK_K
        k_end = tl.minimum((seg_end - tile_first) * BLOCK_K, hidden_size)
        acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, _ = _gemm1_accumulate(
            pid_m, expert, pid_n, k_begin, k_end, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, num_pairs, top_k, inter_size,
            hidden_size, stride_xt, stride_we, stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M,
            BLOCK_N, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER,
        )  # fmt: skip
        let_next_launch(PDL)  # after the first K loop, as the other forms (repeating it changes nothing)
        last = (unit == tile_first) & (seg_end == tile_first + steps)  # the whole tile: nobody else's sums to add
        if not last:
            rows = row_ok[None, :]  # the block's pairs only: padding rows are never read
            slot = part_ptr + (pid * 2 + (unit != start).to(tl.int32)).to(tl.int64) * (2 * tile_elems)
            tl.store(slot + offs, acc_g, mask=rows)
            tl.store(slot + tile_elems + offs, acc_u, mask=rows)
            tl.debug_barrier()  # every thread's partials are written before the counter says so
            first_p = _stream_owner(tile_first, total, programs)
            last_p = _stream_owner(tile_first + steps - 1, total, programs)
            arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
            last = arrived == last_p - first_p
            if last:
                tl.store(counter_ptr + tile, 0)  # ready for the next launch
                acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                # in program order, STREAM_GROUP programs' loads in flight at a time (masked past the last: + 0)
                for p0 in range(first_p, last_p + 1, STREAM_GROUP):
                    for i in tl.static_range(STREAM_GROUP):
                        p = p0 + i
                        # program p's part of this tile is its last segment when its share began before the tile
                        kind = (_stream_start(p, total, programs) < tile_first).to(tl.int32)
                        other = part_ptr + (p * 2 + kind).to(tl.int64) * (2 * tile_elems)
                        mask = rows & (p <= last_p)
                        acc_g += tl.load(other + offs, mask=mask, other=0.0, cache_modifier=".cg")
                        acc_u += tl.load(other + tile_elems + offs, mask=mask, other=0.0, cache_modifier=".cg")
        if last:
            _gemm1_epilogue(acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, expert, wgs_ptr, h_ptr, stride_gse,
                            stride_gsg, stride_ht, LAYOUT, INTERPRETER)  # fmt: skip
        unit = seg_end


@triton.jit
def _gemm2_store(
    acc,  # [BLOCK_N, BLOCK_M] fp32, W2[e] @ h for one N tile
    y_ptr,
    pair_safe,  # [BLOCK_M] int64 pair ids (0 for padding)
    row_ok,  # [BLOCK_M]
    offs_n,
    n_ok,
    scale,  # [BLOCK_M] fp32: global scale * 2^7 * top-k weight
    stride_yt,
    INTERPRETER: tl.constexpr,
):
    y_ptrs = y_ptr + pair_safe[None, :] * stride_yt + offs_n[:, None]
    y = round_to(acc * scale[None, :], y_ptr.dtype.element_ty, INTERPRETER)
    tl.store(y_ptrs, y, mask=row_ok[None, :] & n_ok[:, None])


@triton.jit
def nvfp4_moe_gemm2_kernel(
    h_ptr,  # [P, I] bf16/fp16 from gemm1 (permuted K order)
    w_ptr,  # [E, H, I/4] int16, packed e2m1 (the uint8 [E, H, I/2] tensor viewed as int16)
    ws_ptr,  # [E, H, I/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E] fp32 global scales
    topk_weights_ptr,  # [P] fp32, flattened [T, k]
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32, -1 = no work
    used_blocks_ptr,  # [1] int32: the blocks that hold pairs are 0 .. used - 1
    ready_ptr,  # [num_blocks] int32: gemm1's N tiles of h stored per block (READY), else unused
    y_ptr,  # [P, H] out, dtype of the hidden states; with SPLITS > 1 [SPLITS, P, H] fp32 partials
    num_pairs,
    hidden_size,  # H (the N of this GEMM)
    inter_size,  # I (the K of this GEMM)
    k_per_split,  # K elements per split, a multiple of BLOCK_K (SPLITS > 1)
    ready_tiles,  # gemm1's N tiles a block: h of a block is whole when its ready counter reaches this (READY)
    stride_ht,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # inter_size % BLOCK_K == 0: no K masks
    MULTI_TILE: tl.constexpr,  # programs walk several N tiles (grid axis 1 < N tiles); see below
    SPLITS: tl.constexpr,  # the split axis (_pid) splits K; moe_sum_kernel adds the fp32 partials in split order
    BLOCK_LOOP: tl.constexpr,  # fewer block programs than possible blocks: each walks the used blocks
    LAYOUT: tl.constexpr,  # the weights' layout (as gemm1)
    INTERPRETER: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (after_previous_launch, let_next_launch)
    BLOCKS_LAST: tl.constexpr = False,  # grid (N tile groups, K splits, block programs) instead (_pid)
    HALVES: tl.constexpr = False,  # the N tile as two halves of BLOCK_N / 2 rows, one after the other (not MULTI_TILE)
    ONE_K_STEP: tl.constexpr = False,  # MULTI_TILE with I <= BLOCK_K: the activations loaded once for all tiles
    READY: tl.constexpr = False,  # wait for each block's ready counter (gemm1 READY) instead of the whole of gemm1
):
    """Grid (block programs, N tiles or tile groups, K splits); with BLOCK_LOOP block programs walk the
    used routing blocks as in gemm1. Without MULTI_TILE, program (block, n) computes N tile n. With it, for short K
    loops (I = 256 under TP8 is one or two K steps), program n computes tiles n, n + programs, ... in
    one K loop over (tile, k) steps, so that the weight stream stays pipelined across tiles instead of
    restarting in a new program every few steps. MULTI_TILE and SPLITS > 1 exclude each other.

    With READY (and PDL), a program reads its routing block and waits for that block's h alone (``await_block``), so
    that it may start while gemm1 still runs; it waits for the launch before it at its end instead, so that this
    launch completes after gemm1 (what the top-k sum and later launches wait on). The routing it reads was
    complete before any gemm1 program got past its own wait, and so before this launch started."""
    if not READY:
        after_previous_launch(PDL)
    if BLOCK_LOOP:
        for pid_m in range(_pid(0, BLOCKS_LAST), tl.load(used_blocks_ptr), _nprog(0, BLOCKS_LAST)):
            _gemm2_block(
                pid_m, tl.load(block_expert_ptr + pid_m),
                h_ptr, w_ptr, ws_ptr, wgs_ptr, topk_weights_ptr, sorted_ids_ptr, ready_ptr, y_ptr, num_pairs,
                hidden_size, inter_size, k_per_split, ready_tiles, stride_ht, stride_we, stride_wn, stride_se,
                stride_sn, stride_yt, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, MULTI_TILE, SPLITS, LAYOUT, INTERPRETER, PDL,
                BLOCKS_LAST, HALVES, ONE_K_STEP, READY,
            )  # fmt: skip
    else:  # a program per possible block: the unused ones (expert -1) have nothing to do
        expert = tl.load(block_expert_ptr + _pid(0, BLOCKS_LAST))
        if expert >= 0:
            _gemm2_block(
                _pid(0, BLOCKS_LAST), expert,
                h_ptr, w_ptr, ws_ptr, wgs_ptr, topk_weights_ptr, sorted_ids_ptr, ready_ptr, y_ptr, num_pairs,
                hidden_size, inter_size, k_per_split, ready_tiles, stride_ht, stride_we, stride_wn, stride_se,
                stride_sn, stride_yt, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, MULTI_TILE, SPLITS, LAYOUT, INTERPRETER, PDL,
                BLOCKS_LAST, HALVES, ONE_K_STEP, READY,
            )  # fmt: skip
    if READY:
        after_previous_launch(PDL)


@triton.jit
def _gemm2_block(
    pid_m,  # the routing block
    expert,  # its expert
    h_ptr, w_ptr, ws_ptr, wgs_ptr, topk_weights_ptr, sorted_ids_ptr, ready_ptr, y_ptr, num_pairs, hidden_size,
    inter_size, k_per_split, ready_tiles, stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_yt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    MULTI_TILE: tl.constexpr, SPLITS: tl.constexpr, LAYOUT: tl.constexpr, INTERPRETER: tl.constexpr,
    PDL: tl.constexpr, BLOCKS_LAST: tl.constexpr, HALVES: tl.constexpr, ONE_K_STEP: tl.constexpr,
    READY: tl.constexpr,
):  # fmt: skip
    """gemm2 for routing block pid_m, N tile (group) program_id(1), K split program_id(2)."""
    pid_n = _pid(1, BLOCKS_LAST)
    k_begin, k_end = _split_range(inter_size, k_per_split, SPLITS > 1, BLOCKS_LAST)
    if SPLITS > 1:
        y_ptr += _pid(2, BLOCKS_LAST).to(tl.int64) * num_pairs * stride_yt
    expert = expert.to(tl.int64)
    pair, row_ok, pair_safe = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    h_rows = h_ptr + pair_safe * stride_ht
    # DECODE_UNSCALE = 2^7
    scale = tl.load(wgs_ptr + expert) * 128.0 * tl.load(topk_weights_ptr + pair_safe, mask=row_ok, other=0.0)
    await_block(ready_ptr, pid_m, ready_tiles, READY)
    # The K loop runs at least once (see gemm1): no zero-trip path, no serialized wgmma.
    tl.assume(k_end > k_begin)
    if HALVES:
        HALF: tl.constexpr = BLOCK_N // 2
        offs_a, a_ok, offs_a_safe = tile_columns(pid_n * 2, hidden_size, HALF)
        offs_b, b_ok, offs_b_safe = tile_columns(pid_n * 2 + 1, hidden_size, HALF)
        wa_rows, sa_rows = expert_rows(w_ptr, ws_ptr, expert, offs_a_safe, stride_we, stride_wn, stride_se, stride_sn)
        wb_rows, sb_rows = expert_rows(w_ptr, ws_ptr, expert, offs_b_safe, stride_we, stride_wn, stride_se, stride_sn)
        acc_a = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
        acc_b = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            h0, h1, h2, h3 = load_quarters(h_rows, k0, row_ok, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
            acc_a = nvfp4_dot(acc_a, wa_rows, sa_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K, EVEN_K, LAYOUT,
                               INTERPRETER)  # fmt: skip
            acc_b = nvfp4_dot(acc_b, wb_rows, sb_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K, EVEN_K, LAYOUT,
                               INTERPRETER)  # fmt: skip
        let_next_launch(PDL)
        _gemm2_store(acc_a, y_ptr, pair_safe, row_ok, offs_a, a_ok, scale, stride_yt, INTERPRETER)
        _gemm2_store(acc_b, y_ptr, pair_safe, row_ok, offs_b, b_ok, scale, stride_yt, INTERPRETER)
    elif not MULTI_TILE:
        offs_n, n_ok, offs_n_safe = tile_columns(pid_n, hidden_size, BLOCK_N)
        w_rows, s_rows = expert_rows(w_ptr, ws_ptr, expert, offs_n_safe, stride_we, stride_wn, stride_se, stride_sn)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            h0, h1, h2, h3 = load_quarters(h_rows, k0, row_ok, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
            acc = nvfp4_dot(acc, w_rows, s_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
        let_next_launch(PDL)
        _gemm2_store(acc, y_ptr, pair_safe, row_ok, offs_n, n_ok, scale, stride_yt, INTERPRETER)
    elif ONE_K_STEP:  # several N tiles, K in one step: the block's activations are loaded once for every tile
        programs = _nprog(1, BLOCKS_LAST)
        my_tiles = tl.cdiv(tl.cdiv(hidden_size, BLOCK_N) - pid_n, programs)
        tl.assume(my_tiles > 0)  # grid axis 1 never exceeds the tile count
        h0, h1, h2, h3 = load_quarters(h_rows, k_begin, row_ok, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
        for tile in range(0, my_tiles):
            offs_n, n_ok, offs_n_safe = tile_columns(pid_n + tile * programs, hidden_size, BLOCK_N)
            w_rows, s_rows = expert_rows(w_ptr, ws_ptr, expert, offs_n_safe, stride_we, stride_wn, stride_se,
                                         stride_sn)  # fmt: skip
            acc = nvfp4_dot(tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), w_rows, s_rows, h0, h1, h2, h3,
                             k_begin, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)  # fmt: skip
            _gemm2_store(acc, y_ptr, pair_safe, row_ok, offs_n, n_ok, scale, stride_yt, INTERPRETER)
        let_next_launch(PDL)
    else:
        programs = _nprog(1, BLOCKS_LAST)
        k_steps = tl.cdiv(inter_size, BLOCK_K)
        my_tiles = tl.cdiv(tl.cdiv(hidden_size, BLOCK_N) - pid_n, programs)
        tl.assume(my_tiles > 0)  # grid axis 1 never exceeds the tile count
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for step in range(0, my_tiles * k_steps):
            kk = step % k_steps
            offs_n, n_ok, offs_n_safe = tile_columns(pid_n + (step // k_steps) * programs, hidden_size, BLOCK_N)
            w_rows, s_rows = expert_rows(w_ptr, ws_ptr, expert, offs_n_safe, stride_we, stride_wn, stride_se,
                                         stride_sn)  # fmt: skip
            if kk == 0:  # compiled as the wgmma's "ignore the accumulator" flag, not as moves
                acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            k0 = kk * BLOCK_K
            h0, h1, h2, h3 = load_quarters(h_rows, k0, row_ok, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
            acc = nvfp4_dot(acc, w_rows, s_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
            if kk == k_steps - 1:
                _gemm2_store(acc, y_ptr, pair_safe, row_ok, offs_n, n_ok, scale, stride_yt, INTERPRETER)
        let_next_launch(PDL)
