"""The W4A16 op in one launch, for decode steps of a few pairs (``variants.w4a16_decode``).

At GLM-5 B = 1-4 the four launches of the op (routing, gemm1, gemm2, top-k sum) each pay a launch and a chain of
first reads before their few K steps. Here one grid of persistent programs does all of it:

    valid pairs:  each program reads topk_ids (a few dozen) and ranks the valid ones (no sort, no routing launch)
    gemm1 units:  (valid pair r, N tile n of I, K split s), round-robin over the programs; the last of a tile's
                  splits to arrive adds the fp32 partials in split order, applies SiLU(gate) * up and stores the
                  pair's h (permuted K order, as ``nvfp4_moe``), then counts the tile in the pair's ready counter
    gemm2 units:  (valid pair r, N tile n of H, K split s), after the program's gemm1 units: waits for the pair's
                  h (its ready counter at I's N tiles), stores topk_weight * W2[e] @ h over its K slice as fp32
                  partials, and counts itself in the (token, n) counter; the last to arrive adds the token's
                  partials, slots then splits in order (as ``moe_sum_kernel``), and stores out[token, tile n]

Every sum is in a fixed order, whoever arrives last: the output is deterministic, no float atomics. A pair is a
routing block of its own (row 0 of BLOCK_M; ``_route_each_pair`` does the same), and x is read in its own
layout, the quarters' columns gathered (``_load_x_quarters``), so nothing is laid out before gemm1.

Counters (int32, zero on entry, left zero): split counters [P, I tiles], ready counters [P], token counters
[T, H tiles], finished tiles [T]. The last program of a token's last tile resets the token's ready counters, once
every gemm2 unit that waits on them has passed its wait.

A gemm2 unit waits for gemm1 units of other programs: every program must be resident at once (the grid is at most
what fits on the GPU, ``w4a16_decode.plan``), and gemm1 units come first in every program, so the units waited on
are running or done. The interpreter runs programs one after another: there the host launches gemm1's units
(PHASES 1) and then gemm2's (PHASES 2), and the waits find their counters already full.
"""

import triton
import triton.language as tl

from sglang_glm5.kernels.nvfp4_moe import (
    _gemm1_epilogue,
    _load_quarters,
    _nvfp4_dot,
    after_previous_launch,
    expert_rows,
    let_next_launch,
    mark_block_ready,
    round_to,
    tile_columns,
)


@triton.jit
def _load_x_quarters(
    x_rows,  # [BLOCK_M] pointers to activation rows in their own (unpermuted) order
    k0,
    row_ok,
    K,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    LAYOUT: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """``_load_quarters`` from unpermuted rows: the four [BLOCK_K // 4, BLOCK_M] tiles of K step k0 that word slot c
    of the weights meets, tile q holding the columns of its code q (4c + q; in the kernel_wgmma layout the column
    ``_permuted_column`` puts at slot c of quarter q)."""
    c = tl.arange(0, BLOCK_K // 4)
    if LAYOUT == 2:  # slot c = 16g + 8h + 2b + i holds word 4b + 2h + i of group g of 16 words
        col = k0 + (c // 16) * 64 + ((c % 8) // 2) * 16 + ((c % 16) // 8) * 8 + (c % 2) * 4
    else:
        col = k0 + 4 * c
    mask = row_ok[None, :] if EVEN_K else row_ok[None, :] & (col < K)[:, None]
    ptrs = x_rows[None, :] + col[:, None]
    x0 = tl.load(ptrs, mask=mask, other=0.0)
    x1 = tl.load(ptrs + 1, mask=mask, other=0.0)
    x2 = tl.load(ptrs + 2, mask=mask, other=0.0)
    x3 = tl.load(ptrs + 3, mask=mask, other=0.0)
    if INTERPRETER:
        return x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    else:
        return x0, x1, x2, x3


@triton.jit
def _await_count(ptr, target, POLL: tl.constexpr, SLEEP_NS: tl.constexpr):
    """Wait until the int32 at ``ptr`` reaches ``target``, then acquire: POLL 0 reads it by atomics (one a program),
    1 by plain volatile loads (served by the L2 without its atomic unit) with one acquire atomic at the end; SLEEP_NS
    > 0 sleeps between reads."""
    if POLL == 0:
        while tl.atomic_add(ptr, 0, sem="acquire", scope="gpu") < target:
            if SLEEP_NS > 0:
                _sleep(target, SLEEP_NS)
    else:
        while tl.load(ptr, volatile=True) < target:
            if SLEEP_NS > 0:
                _sleep(target, SLEEP_NS)
        tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _sleep(x, NS: tl.constexpr):
    """Sleep about NS nanoseconds (``nanosleep``, sm_70+); returns NS."""
    return tl.inline_asm_elementwise("nanosleep.u32 $1; mov.b32 $0, $1;", "=r,r", [x * 0 + NS], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _valid_pair(ids, ok, rank, r):
    """(pair id, expert as int64) of the r-th valid pair."""
    sel = ok & (rank == r)
    pair = tl.sum(tl.where(sel, tl.arange(0, ids.shape[0]), 0), axis=0)
    expert = tl.sum(tl.where(sel, ids, 0), axis=0).to(tl.int64)
    return pair, expert


@triton.jit
def nvfp4_moe_decode_kernel(
    x_ptr,  # [T, H] bf16/fp16 hidden states, their own K order
    w13_ptr,  # [E, 2I, H/4] int16 packed e2m1
    s13_ptr,  # [E, 2I, H/16] uint8 block scales
    gs13_ptr,  # [E, 2] fp32 global scales (gate, up), by strides
    w2_ptr,  # [E, H, I/4] int16 packed e2m1
    s2_ptr,  # [E, H, I/16] uint8 block scales
    gs2_ptr,  # [E] fp32 global scales
    topk_ids_ptr,  # [P] int32/int64, flattened [T, k]; valid when 0 <= id < num_experts
    topk_weights_ptr,  # [P] fp32
    part_ptr,  # [SPLITS1, P, 2, I] fp32 gemm1 partials (SPLITS1 > 1)
    h_ptr,  # [P, I] dtype of x: h in the permuted K order
    y_ptr,  # [SPLITS2, P, H] fp32 gemm2 partials, top-k weight applied
    out_ptr,  # [T, H] dtype of x
    split_count_ptr,  # [P * I tiles] int32, zero: gemm1's splits of a tile arrived (SPLITS1 > 1)
    ready_ptr,  # [P] int32, zero: gemm1 N tiles of h stored per pair
    token_count_ptr,  # [T * H tiles] int32, zero: gemm2 units of a (token, tile) arrived
    tiles_done_ptr,  # [T] int32, zero: H tiles of out stored per token
    num_pairs,
    num_experts,
    inter_size,  # I
    hidden_size,  # H
    k1_per_split,  # K elements of gemm1 a split, a multiple of BLOCK_K1
    k2_per_split,  # of gemm2, a multiple of BLOCK_K2
    stride_xt,
    stride_w13e,
    stride_w13n,
    stride_s13e,
    stride_s13n,
    stride_gse,
    stride_gsg,  # 0 when one global scale serves gate and up
    stride_w2e,
    stride_w2n,
    stride_s2e,
    stride_s2n,
    stride_ot,
    gate_row0,
    up_row0,
    TOP_K: tl.constexpr,
    PAIRS_PAD: tl.constexpr,  # power of two >= P
    BLOCK_M: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    BLOCK_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_K2: tl.constexpr,
    SPLITS1: tl.constexpr,
    SPLITS2: tl.constexpr,
    EVEN_K1: tl.constexpr,  # H % BLOCK_K1 == 0
    EVEN_K2: tl.constexpr,  # I % BLOCK_K2 == 0
    LAYOUT: tl.constexpr,  # the weights' layout (nvfp4.LAYOUTS index)
    INTERPRETER: tl.constexpr,
    PDL: tl.constexpr = False,
    PHASES: tl.constexpr = 3,  # 1: gemm1's units only, 2: gemm2's only (the interpreter), 3: both
    POLL: tl.constexpr = 0,  # how a gemm2 unit reads its pair's ready counter (_await_count)
    SLEEP_NS: tl.constexpr = 0,
):
    after_previous_launch(PDL)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    b = tl.arange(0, PAIRS_PAD)
    ids = tl.load(topk_ids_ptr + b, mask=b < num_pairs, other=-1)
    ok = (ids >= 0) & (ids < num_experts)
    rank = tl.cumsum(ok.to(tl.int32), axis=0) - 1
    valid = tl.sum(ok.to(tl.int32), axis=0)
    tiles1 = tl.cdiv(inter_size, BLOCK_N1)
    tiles2 = tl.cdiv(hidden_size, BLOCK_N2)
    m = tl.arange(0, BLOCK_M)
    row_ok = m == 0  # a pair is a block of its own
    num_tokens = num_pairs // TOP_K
    let_next_launch(PDL)

    if PHASES & 1:
        for u in range(pid, valid * tiles1 * SPLITS1, programs):
            pair, expert = _valid_pair(ids, ok, rank, u // (tiles1 * SPLITS1))
            n = (u // SPLITS1) % tiles1
            s = u % SPLITS1
            pair_safe = tl.where(row_ok, pair, 0).to(tl.int64)
            x_rows = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xt + m * 0
            offs_n, n_ok, offs_n_safe = tile_columns(n, inter_size, BLOCK_N1)
            wg_rows, sg_rows = expert_rows(w13_ptr, s13_ptr, expert, gate_row0 + offs_n_safe, stride_w13e,
                                           stride_w13n, stride_s13e, stride_s13n)  # fmt: skip
            wu_rows, su_rows = expert_rows(w13_ptr, s13_ptr, expert, up_row0 + offs_n_safe, stride_w13e,
                                           stride_w13n, stride_s13e, stride_s13n)  # fmt: skip
            k_begin = s * k1_per_split
            k_end = tl.minimum(k_begin + k1_per_split, hidden_size)
            acc_g = tl.zeros((BLOCK_N1, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N1, BLOCK_M), dtype=tl.float32)
            tl.assume(k_end > k_begin)
            for k0 in range(k_begin, k_end, BLOCK_K1):
                x0, x1, x2, x3 = _load_x_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K1, EVEN_K1, LAYOUT,
                                                  INTERPRETER)  # fmt: skip
                acc_g = _nvfp4_dot(acc_g, wg_rows, sg_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K1, EVEN_K1,
                                   LAYOUT, INTERPRETER)  # fmt: skip
                acc_u = _nvfp4_dot(acc_u, wu_rows, su_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K1, EVEN_K1,
                                   LAYOUT, INTERPRETER)  # fmt: skip
            last = True
            if SPLITS1 > 1:
                split_stride = num_pairs * 2 * inter_size
                p_ptrs = part_ptr + pair_safe[None, :] * (2 * inter_size) + offs_n_safe[:, None]
                mask = row_ok[None, :] & n_ok[:, None]
                tl.store(p_ptrs + s * split_stride, acc_g, mask=mask)
                tl.store(p_ptrs + s * split_stride + inter_size, acc_u, mask=mask)
                tl.debug_barrier()  # every thread's partials are written before the counter says so
                arrived = tl.atomic_add(split_count_ptr + pair * tiles1 + n, 1, sem="acq_rel", scope="gpu")
                last = arrived == SPLITS1 - 1
                if last:
                    tl.store(split_count_ptr + pair * tiles1 + n, 0)
                    acc_g = tl.zeros((BLOCK_N1, BLOCK_M), dtype=tl.float32)
                    acc_u = tl.zeros((BLOCK_N1, BLOCK_M), dtype=tl.float32)
                    for split in tl.static_range(SPLITS1):
                        acc_g += tl.load(p_ptrs + split * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
                        acc_u += tl.load(p_ptrs + split * split_stride + inter_size, mask=mask, other=0.0,
                                         cache_modifier=".cg")  # fmt: skip
            if last:
                _gemm1_epilogue(acc_g, acc_u, row_ok, pair_safe, offs_n, n_ok, expert, gs13_ptr, h_ptr, stride_gse,
                                stride_gsg, inter_size, LAYOUT, INTERPRETER)  # fmt: skip
                mark_block_ready(ready_ptr, pair, True)

    if PHASES & 2:
        # tokens none of whose slots is local: their output is zero
        for t in range(pid, num_tokens, programs):
            if tl.sum((ok & (b // TOP_K == t)).to(tl.int32), axis=0) == 0:
                for c0 in range(0, hidden_size, BLOCK_N2):
                    offs = c0 + tl.arange(0, BLOCK_N2)
                    zero = tl.zeros((BLOCK_N2,), dtype=out_ptr.dtype.element_ty)
                    tl.store(out_ptr + t * stride_ot + offs, zero, mask=offs < hidden_size)
        for u in range(pid, valid * tiles2 * SPLITS2, programs):
            pair, expert = _valid_pair(ids, ok, rank, u // (tiles2 * SPLITS2))
            n = (u // SPLITS2) % tiles2
            s = u % SPLITS2
            token = pair // TOP_K
            pair_safe = tl.where(row_ok, pair, 0).to(tl.int64)
            offs_n, n_ok, offs_n_safe = tile_columns(n, hidden_size, BLOCK_N2)
            w_rows, s_rows = expert_rows(w2_ptr, s2_ptr, expert, offs_n_safe, stride_w2e, stride_w2n, stride_s2e,
                                         stride_s2n)  # fmt: skip
            scale = tl.load(gs2_ptr + expert) * 128.0 * tl.load(topk_weights_ptr + pair_safe, mask=row_ok, other=0.0)
            h_rows = h_ptr + pair_safe * inter_size
            k_begin = s * k2_per_split
            k_end = tl.minimum(k_begin + k2_per_split, inter_size)
            _await_count(ready_ptr + pair, tiles1, POLL, SLEEP_NS)
            acc = tl.zeros((BLOCK_N2, BLOCK_M), dtype=tl.float32)
            tl.assume(k_end > k_begin)
            for k0 in range(k_begin, k_end, BLOCK_K2):
                h0, h1, h2, h3 = _load_quarters(h_rows, k0, row_ok, inter_size, BLOCK_K2, EVEN_K2, LAYOUT,
                                                INTERPRETER)  # fmt: skip
                acc = _nvfp4_dot(acc, w_rows, s_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K2, EVEN_K2, LAYOUT,
                                 INTERPRETER)  # fmt: skip
            y_split = y_ptr + s.to(tl.int64) * num_pairs * hidden_size
            tl.store(y_split + pair_safe[None, :] * hidden_size + offs_n[:, None], acc * scale[None, :],
                     mask=row_ok[None, :] & n_ok[:, None])  # fmt: skip
            tl.debug_barrier()  # every thread's partials are written before the counter says so
            slots = tl.sum((ok & (b // TOP_K == token)).to(tl.int32), axis=0)
            arrived = tl.atomic_add(token_count_ptr + token * tiles2 + n, 1, sem="acq_rel", scope="gpu")
            if arrived == slots * SPLITS2 - 1:
                tl.store(token_count_ptr + token * tiles2 + n, 0)
                total = tl.zeros((BLOCK_N2,), dtype=tl.float32)
                for j in tl.static_range(TOP_K):
                    slot = token * TOP_K + j
                    eid = tl.load(topk_ids_ptr + slot)
                    slot_ok = n_ok & (eid >= 0) & (eid < num_experts)
                    for split in tl.static_range(SPLITS2):
                        total += tl.load(y_ptr + (split * num_pairs + slot).to(tl.int64) * hidden_size + offs_n,
                                         mask=slot_ok, other=0.0, cache_modifier=".cg")  # fmt: skip
                tl.store(out_ptr + token.to(tl.int64) * stride_ot + offs_n,
                         round_to(total, out_ptr.dtype.element_ty, INTERPRETER), mask=n_ok)  # fmt: skip
                done = tl.atomic_add(tiles_done_ptr + token, 1, sem="acq_rel", scope="gpu")
                if done == tiles2 - 1:  # every gemm2 unit of the token's pairs has passed its wait
                    tl.store(tiles_done_ptr + token, 0)
                    for j in tl.static_range(TOP_K):
                        tl.store(ready_ptr + token * TOP_K + j, 0)
