"""Triton kernels of the NVFP4 (W4A16) fused-MoE path.

Data flow (P = T * top_k (token, slot) pairs, sorted by expert on the host side into blocks of
BLOCK_M pairs that share one expert; ``sorted_ids`` holds pair ids, ``num_pairs`` marks padding):

    gemm1:  h[p, :]   = silu(x[p // k] @ Wg[e]^T) * (x[p // k] @ Wu[e]^T)          -> [P, I]
    gemm2:  y[p, :]   = topk_weight[p] * (h[p] @ W2[e]^T)                          -> [P, H]
    reduce: out[t, :] = sum over slots j with topk_ids[t, j] valid of y[t * k + j]  -> [T, H]

Weights stay NVFP4 in memory and are decoded in registers. Each packed byte holds elements 2i
(low nibble) and 2i+1 (high nibble) of a row; instead of interleaving the two nibbles back into
one [BLOCK_N, BLOCK_K] tile, each K step does two half-width dots: even K columns of the
activations against the low nibbles, odd against the high ones (a dot product does not care in
which order K is summed).

Decode, all in fp16: a nibble's bits placed into an fp16 (exponent bits 2-1 -> 11-10, mantissa
bit 0 -> 9, sign -> 15) are exactly e2m1 * 2^-14, subnormals included. The block scale (one e4m3
byte per 16 elements, decoded once per group of 16) becomes the fp16 scale * 2^7, so the decoded
weight e2m1 * scale * 2^-7 is exact in fp16 (at most 5 significant bits, >= 2^-17). Activations
enter the dot as fp16 scaled by 2^-8, which keeps bf16 values up to 2^24 finite. The tensor cores
multiply fp16 x fp16 into fp32; the epilogue multiplies by global_scale * 2^15 (``DECODE_UNSCALE``).

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
def _e2m1_nibbles_to_f16(nib):
    """int16 nibbles (0..15) -> fp16 e2m1 value * 2^-14."""
    bits = ((nib & 0x7) << 9) | ((nib & 0x8) << 12)
    return bits.to(tl.float16, bitcast=True)


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
def _activation_tile(
    rows_ptr,  # [BLOCK_M] pointers to the first element of each activation row
    k0,
    row_ok,  # [BLOCK_M]
    K,
    BLOCK_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """Load [BLOCK_M, BLOCK_K] activations; returns (even K columns, odd K columns) as dot operands."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(rows_ptr[:, None] + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    a = a.to(tl.float32) * 0.00390625  # ACT_SCALE = 2^-8
    a = a if INTERPRETER else a.to(tl.float16)
    even, odd = tl.split(tl.reshape(a, (a.shape[0], BLOCK_K // 2, 2)))
    return even, odd


@triton.jit
def _nvfp4_tile(
    w_rows_ptr,  # [BLOCK_N] pointers to the first packed byte of each weight row
    s_rows_ptr,  # [BLOCK_N] pointers to the first scale byte of each weight row
    k0,
    n_ok,  # [BLOCK_N]
    K,
    BLOCK_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """Load and decode one weight tile; returns (low, high) nibble tiles [BLOCK_N, BLOCK_K // 2]."""
    GROUPS: tl.constexpr = BLOCK_K // 16  # one e4m3 scale per 16 elements = per 8 packed bytes
    offs_g = k0 // 16 + tl.arange(0, GROUPS)
    byte_offs = offs_g[:, None] * 8 + tl.arange(0, 8)[None, :]  # [GROUPS, 8]
    g_ok = offs_g < K // 16
    mask = n_ok[:, None, None] & g_ok[None, :, None]
    packed = tl.load(w_rows_ptr[:, None, None] + byte_offs[None, :, :], mask=mask, other=0).to(tl.int16)
    sbyte = tl.load(s_rows_ptr[:, None] + offs_g[None, :], mask=n_ok[:, None] & g_ok[None, :], other=0)
    # e4m3 byte placed into an fp16 is scale * 2^-8, exactly; times 2^15 gives scale * 2^7 (<= 57344).
    sbits = ((sbyte.to(tl.int16) & 0x7F) << 7) | ((sbyte.to(tl.int16) & 0x80) << 8)
    scale = (sbits.to(tl.float16, bitcast=True).to(tl.float32) * 32768.0).to(tl.float16)[:, :, None]
    lo = _e2m1_nibbles_to_f16(packed & 0xF) * scale
    hi = _e2m1_nibbles_to_f16(packed >> 4) * scale
    shape: tl.constexpr = (w_rows_ptr.shape[0], BLOCK_K // 2)
    if INTERPRETER:
        return tl.reshape(lo.to(tl.float32), shape), tl.reshape(hi.to(tl.float32), shape)
    else:
        return tl.reshape(lo, shape), tl.reshape(hi, shape)


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
    wg_rows = w_base + (gate_row0 + offs_n_safe) * stride_wn
    wu_rows = w_base + (up_row0 + offs_n_safe) * stride_wn
    sg_rows = s_base + (gate_row0 + offs_n_safe) * stride_sn
    su_rows = s_base + (up_row0 + offs_n_safe) * stride_sn

    x_rows = x_ptr + token * stride_xt
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        x_even, x_odd = _activation_tile(x_rows, k0, row_ok, hidden_size, BLOCK_K, INTERPRETER)
        g_lo, g_hi = _nvfp4_tile(wg_rows, sg_rows, k0, n_ok, hidden_size, BLOCK_K, INTERPRETER)
        acc_g = tl.dot(x_even, tl.trans(g_lo), acc_g)
        acc_g = tl.dot(x_odd, tl.trans(g_hi), acc_g)
        u_lo, u_hi = _nvfp4_tile(wu_rows, su_rows, k0, n_ok, hidden_size, BLOCK_K, INTERPRETER)
        acc_u = tl.dot(x_even, tl.trans(u_lo), acc_u)
        acc_u = tl.dot(x_odd, tl.trans(u_hi), acc_u)

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
    w_rows = w_ptr + expert * stride_we + offs_n_safe * stride_wn
    s_rows = ws_ptr + expert * stride_se + offs_n_safe * stride_sn

    h_rows = h_ptr + pair_safe * stride_ht
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        a_even, a_odd = _activation_tile(h_rows, k0, row_ok, inter_size, BLOCK_K, INTERPRETER)
        w_lo, w_hi = _nvfp4_tile(w_rows, s_rows, k0, n_ok, inter_size, BLOCK_K, INTERPRETER)
        acc = tl.dot(a_even, tl.trans(w_lo), acc)
        acc = tl.dot(a_odd, tl.trans(w_hi), acc)

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
