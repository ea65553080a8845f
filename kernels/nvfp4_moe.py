"""Triton kernels of the NVFP4 (W4A16) fused-MoE path.

Data flow (P = T * top_k (token, slot) pairs, sorted by expert on the host side into blocks of
BLOCK_M pairs that share one expert; ``sorted_ids`` holds pair ids, ``num_pairs`` marks padding):

    gemm1:  h[p, :]   = silu(x[p // k] @ Wg[e]^T) * (x[p // k] @ Wu[e]^T)          -> [P, I]
    gemm2:  y[p, :]   = topk_weight[p] * (h[p] @ W2[e]^T)                          -> [P, H]
    reduce: out[t, :] = sum over slots j with topk_ids[t, j] valid of y[t * k + j]  -> [T, H]

Weights stay NVFP4 in memory and are decoded in registers, four packed bytes (8 elements) at a
time: one int32 word holds the bytes of K offsets 8j..8j+7 of a row, byte b holding elements 2b (low
nibble) and 2b+1 (high nibble). Each of the shifts 0, 4, 8, 12 followed by one mask places two
nibbles (bytes b and b+2) into the two halves of the word as fp16 bit patterns: exponent bits 2-1 ->
11-10, mantissa bit 0 -> 9, sign -> 15, which is exactly e2m1 * 2^-14, subnormals included. So one
word gives 8 tiles, tile r holding K offset 8j + r, and each K step does 8 dots of BLOCK_K / 8: the
activation tile is split the same way (a dot product does not care in which order K is summed).

The block scale (one e4m3 byte per 16 elements) becomes the fp16 scale * 2^7, so a decoded weight,
e2m1 * scale * 2^-7, is exact in fp16 (at most 5 significant bits, >= 2^-17). Activations enter the
dot as fp16 scaled by 2^-8, which keeps bf16 values up to 2^24 finite. The tensor cores multiply
fp16 x fp16 into fp32; the epilogue multiplies by global_scale * 2^15 (``DECODE_UNSCALE``).

``INTERPRETER`` works around two faults of the Triton interpreter (TRITON_INTERPRET=1, used by the
CPU tests): it computes bf16 dots wrongly (triton issue #11584), so both dot operands are upcast to
fp32; and its fp32 -> bf16 cast truncates, so bf16 results are rounded to nearest-even by hand.
"""

import triton
import triton.language as tl

# Weights decoded as value * 2^-7 and activations scaled by 2^-8: the epilogue multiplies by 2^15.
DECODE_UNSCALE = 2.0**15
ACT_SCALE = 2.0**-8


@triton.jit
def _round_to(v, dtype: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32 -> dtype, round to nearest even (by hand for bf16 in the interpreter)."""
    if INTERPRETER and dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dtype)


@triton.jit
def _split_last(t):
    """[..., 2] -> two tensors, along a new innermost split."""
    return tl.split(t)


@triton.jit
def _nibble_pair(words, shift: tl.constexpr, scale, INTERPRETER: tl.constexpr):
    """Two nibbles per int32 word -> two fp16 tiles (bytes b and b + 2), times the fp16 scale."""
    v = words >> shift
    bits = ((v & 0x00070007) << 9) | ((v & 0x00080008) << 12)
    first = bits.to(tl.int16).to(tl.float16, bitcast=True) * scale
    second = (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True) * scale
    shape: tl.constexpr = (words.shape[0], words.shape[1] * words.shape[2])
    if INTERPRETER:
        return tl.reshape(first.to(tl.float32), shape), tl.reshape(second.to(tl.float32), shape)
    else:
        return tl.reshape(first, shape), tl.reshape(second, shape)


@triton.jit
def _activation_tiles(
    rows_ptr,  # [BLOCK_M] pointers to the first element of each activation row
    k0,
    row_ok,  # [BLOCK_M]
    K,
    BLOCK_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """Load [BLOCK_M, BLOCK_K] activations, scaled by 2^-8; returns 8 tiles, tile r = K offsets 8j + r."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(rows_ptr[:, None] + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    a = a.to(tl.float32) * 0.00390625  # ACT_SCALE = 2^-8
    a = a if INTERPRETER else a.to(tl.float16)
    a = tl.reshape(a, (a.shape[0], BLOCK_K // 8, 2, 2, 2))  # [m, j, r // 4, (r // 2) % 2, r % 2]
    even, odd = _split_last(a)
    e0, e1 = _split_last(even)  # r % 4 in {0, 2}
    o0, o1 = _split_last(odd)  # r % 4 in {1, 3}
    a0, a4 = _split_last(e0)
    a2, a6 = _split_last(e1)
    a1, a5 = _split_last(o0)
    a3, a7 = _split_last(o1)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _nvfp4_dot_step(
    acc,  # [BLOCK_M, BLOCK_N] fp32
    a0, a1, a2, a3, a4, a5, a6, a7,  # from _activation_tiles
    w_rows_ptr,  # [BLOCK_N] int32 pointers to the first packed word of each weight row
    s_rows_ptr,  # [BLOCK_N] pointers to the first scale byte of each weight row
    k0,
    n_ok,  # [BLOCK_N]
    K,
    BLOCK_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):  # fmt: skip
    """acc += activations[:, k0:k0+BLOCK_K] @ decode(W[:, k0:k0+BLOCK_K])^T."""
    GROUPS: tl.constexpr = BLOCK_K // 16  # one e4m3 scale per 16 elements = per 2 packed words
    offs_g = k0 // 16 + tl.arange(0, GROUPS)
    g_ok = offs_g < K // 16
    word_offs = offs_g[:, None] * 2 + tl.arange(0, 2)[None, :]  # [GROUPS, 2]
    words = tl.load(w_rows_ptr[:, None, None] + word_offs[None, :, :], mask=n_ok[:, None, None] & g_ok[None, :, None])
    sbyte = tl.load(s_rows_ptr[:, None] + offs_g[None, :], mask=n_ok[:, None] & g_ok[None, :], other=0)
    # An e4m3 byte placed into an fp16 is scale * 2^-8, exactly; times 2^15 gives scale * 2^7 (<= 61440).
    # Masked-off words decode to finite garbage (|w| <= 22.5) that meets zero activations or is never stored.
    sb = sbyte.to(tl.int16)
    sbits = ((sb & 0x7F) << 7) | ((sb & 0x80) << 8)
    scale = (sbits.to(tl.float16, bitcast=True).to(tl.float32) * 32768.0).to(tl.float16)[:, :, None]
    w0, w4 = _nibble_pair(words, 0, scale, INTERPRETER)
    acc = tl.dot(a0, tl.trans(w0), acc)
    acc = tl.dot(a4, tl.trans(w4), acc)
    w1, w5 = _nibble_pair(words, 4, scale, INTERPRETER)
    acc = tl.dot(a1, tl.trans(w1), acc)
    acc = tl.dot(a5, tl.trans(w5), acc)
    w2, w6 = _nibble_pair(words, 8, scale, INTERPRETER)
    acc = tl.dot(a2, tl.trans(w2), acc)
    acc = tl.dot(a6, tl.trans(w6), acc)
    w3, w7 = _nibble_pair(words, 12, scale, INTERPRETER)
    acc = tl.dot(a3, tl.trans(w3), acc)
    acc = tl.dot(a7, tl.trans(w7), acc)
    return acc


@triton.jit
def nvfp4_moe_gemm1_kernel(
    x_ptr,  # [T, H] bf16/fp16 hidden states
    w_ptr,  # [E, 2I, H/2] uint8, packed e2m1
    ws_ptr,  # [E, 2I, H/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E, 2] fp32 global scales (gate, up), addressed by strides
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32 expert of each block, -1 = no work
    h_ptr,  # [P, I] output, dtype of x
    num_pairs,  # P = T * top_k
    top_k,
    inter_size,  # I
    hidden_size,  # H (the K of this GEMM)
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
    INTERPRETER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter_size
    offs_n_safe = tl.where(n_ok, offs_n, 0).to(tl.int64)
    w_base = w_ptr + expert * stride_we
    s_base = ws_ptr + expert * stride_se
    wg_rows = (w_base + (gate_row0 + offs_n_safe) * stride_wn).to(tl.pointer_type(tl.int32))  # rows are 16 B aligned
    wu_rows = (w_base + (up_row0 + offs_n_safe) * stride_wn).to(tl.pointer_type(tl.int32))
    sg_rows = s_base + (gate_row0 + offs_n_safe) * stride_sn
    su_rows = s_base + (up_row0 + offs_n_safe) * stride_sn

    x_rows = x_ptr + token * stride_xt
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        a0, a1, a2, a3, a4, a5, a6, a7 = _activation_tiles(x_rows, k0, row_ok, hidden_size, BLOCK_K, INTERPRETER)
        acc_g = _nvfp4_dot_step(acc_g, a0, a1, a2, a3, a4, a5, a6, a7, wg_rows, sg_rows, k0, n_ok, hidden_size,
                                BLOCK_K, INTERPRETER)  # fmt: skip
        acc_u = _nvfp4_dot_step(acc_u, a0, a1, a2, a3, a4, a5, a6, a7, wu_rows, su_rows, k0, n_ok, hidden_size,
                                BLOCK_K, INTERPRETER)  # fmt: skip

    gs_gate = tl.load(wgs_ptr + expert * stride_gse) * 32768.0  # DECODE_UNSCALE = 2^15
    gs_up = tl.load(wgs_ptr + expert * stride_gse + stride_gsg) * 32768.0
    gate = acc_g * gs_gate
    up = acc_u * gs_up
    h = gate / (1.0 + tl.exp(-gate)) * up
    h_ptrs = h_ptr + tl.where(row_ok, pair, 0).to(tl.int64)[:, None] * stride_ht + offs_n[None, :]
    tl.store(h_ptrs, _round_to(h, h_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def nvfp4_moe_gemm2_kernel(
    h_ptr,  # [P, I] bf16/fp16, output of gemm1
    w_ptr,  # [E, H, I/2] uint8, packed e2m1
    ws_ptr,  # [E, H, I/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E] fp32 global scales
    topk_weights_ptr,  # [P] fp32, flattened [T, k]
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32, -1 = no work
    y_ptr,  # [P, H] output, dtype of h
    num_pairs,
    hidden_size,  # H (the N of this GEMM)
    inter_size,  # I (the K of this GEMM)
    stride_ht,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    pair_safe = tl.where(row_ok, pair, 0).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden_size
    offs_n_safe = tl.where(n_ok, offs_n, 0).to(tl.int64)
    w_rows = (w_ptr + expert * stride_we + offs_n_safe * stride_wn).to(tl.pointer_type(tl.int32))
    s_rows = ws_ptr + expert * stride_se + offs_n_safe * stride_sn

    h_rows = h_ptr + pair_safe * stride_ht
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        a0, a1, a2, a3, a4, a5, a6, a7 = _activation_tiles(h_rows, k0, row_ok, inter_size, BLOCK_K, INTERPRETER)
        acc = _nvfp4_dot_step(acc, a0, a1, a2, a3, a4, a5, a6, a7, w_rows, s_rows, k0, n_ok, inter_size,
                              BLOCK_K, INTERPRETER)  # fmt: skip

    gs = tl.load(wgs_ptr + expert) * 32768.0  # DECODE_UNSCALE = 2^15
    route_w = tl.load(topk_weights_ptr + pair_safe, mask=row_ok, other=0.0)
    y = acc * (gs * route_w[:, None])
    y_ptrs = y_ptr + pair_safe[:, None] * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, _round_to(y, y_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_sum_kernel(
    y_ptr,  # [T * k, H] per-pair outputs (rows of invalid slots are never written)
    topk_ids_ptr,  # [T * k] int32/int64, valid when 0 <= id < num_experts
    out_ptr,  # [T, H]
    hidden_size,
    num_experts,
    stride_yt,
    stride_ot,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """out[t] = sum of y over the valid slots of token t, in fp32, slots in order (deterministic)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs < hidden_size
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        eid = tl.load(topk_ids_ptr + t * TOP_K + j)
        valid = (eid >= 0) & (eid < num_experts)
        y = tl.load(y_ptr + (t * TOP_K + j) * stride_yt + offs, mask=h_ok & valid, other=0.0)
        acc += y.to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs, _round_to(acc, out_ptr.dtype.element_ty, INTERPRETER), mask=h_ok)


@triton.jit
def moe_align_count_kernel(
    topk_ids_ptr,  # [P] int32/int64, flattened [T, k]
    counts_ptr,  # [E] int32 out: pairs per expert
    num_pairs,
    BLOCK: tl.constexpr,
):
    """Program e counts the pairs routed to local expert e."""
    e = tl.program_id(0)
    total = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
        total += (ids == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(total, axis=0))


@triton.jit
def moe_align_place_kernel(
    topk_ids_ptr,  # [P] int32/int64
    counts_ptr,  # [E] int32, from moe_align_count_kernel
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 out: pair ids by expert, P = padding
    block_expert_ptr,  # [num_blocks] int32 out: expert of each block, -1 = unused
    num_pairs,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,  # power of two >= num_experts
    BLOCK: tl.constexpr,
):
    """Program e < E writes expert e's pairs (in pair order), its padding and its block experts;
    program E marks the unused tail blocks."""
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + offs_e, mask=offs_e < num_experts, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    first_block = tl.sum(tl.where(offs_e < e, blocks, 0), axis=0)
    if e < num_experts:
        count = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
        my_blocks = tl.sum(tl.where(offs_e == e, blocks, 0), axis=0)
        base = first_block * BLOCK_M
        placed = 0
        for start in range(0, num_pairs, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
            hit = (ids == e).to(tl.int32)
            rank = placed + tl.cumsum(hit, axis=0) - 1
            tl.store(sorted_ids_ptr + base + rank, offs.to(tl.int32), mask=hit != 0)
            placed += tl.sum(hit, axis=0)
        for start in range(count, my_blocks * BLOCK_M, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(sorted_ids_ptr + base + offs, num_pairs, mask=offs < my_blocks * BLOCK_M)
        for start in range(0, my_blocks, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(block_expert_ptr + first_block + offs, e, mask=offs < my_blocks)
    else:
        for start in range(first_block, num_blocks, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(block_expert_ptr + offs, -1, mask=offs < num_blocks)
        for start in range(first_block * BLOCK_M, num_blocks * BLOCK_M, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(sorted_ids_ptr + offs, num_pairs, mask=offs < num_blocks * BLOCK_M)
