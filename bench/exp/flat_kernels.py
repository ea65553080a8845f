"""Experimental kernels: each program walks several N tiles of one routing block in a single K loop
(step = tile * k_steps + k), so that the weight stream is pipelined across tile boundaries instead of
restarting in a new program every k_steps steps. Same arithmetic and K order as the shipped kernels.
Grid: (routing blocks, programs per block); program p takes tiles p, p + programs, ..."""

import triton
import triton.language as tl

from sglang_glm5.kernels.nvfp4_moe import (
    _block_pairs,
    _load_quarters,
    _nvfp4_dot,
    _permuted_column,
    _round_to,
    _tile_columns,
)


@triton.jit
def gemm2_flat_kernel(
    h_ptr,
    w_ptr,
    ws_ptr,
    wgs_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    y_ptr,
    num_pairs,
    hidden_size,
    inter_size,
    stride_ht,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)
    pair, row_ok = _block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    pair_safe = tl.where(row_ok, pair, 0).to(tl.int64)
    h_rows = h_ptr + pair_safe * stride_ht
    gs = tl.load(wgs_ptr + expert) * 128.0
    route_w = tl.load(topk_weights_ptr + pair_safe, mask=row_ok, other=0.0)
    n_tiles = tl.cdiv(hidden_size, BLOCK_N)
    k_steps = tl.cdiv(inter_size, BLOCK_K)
    n_programs = tl.num_programs(1)
    my_tiles = tl.cdiv(n_tiles - pid_n, n_programs)
    tl.assume(k_steps > 0)
    tl.assume(my_tiles > 0)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(0, my_tiles * k_steps):
        tile = pid_n + (step // k_steps) * n_programs
        kk = step % k_steps
        k0 = kk * BLOCK_K
        offs_n, n_ok, offs_n_safe = _tile_columns(tile, hidden_size, BLOCK_N)
        w_rows = w_ptr + expert * stride_we + offs_n_safe * stride_wn
        s_rows = ws_ptr + expert * stride_se + offs_n_safe * stride_sn
        if kk == 0:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        h0, h1, h2, h3 = _load_quarters(h_rows, k0, row_ok, inter_size, BLOCK_K, EVEN_K, INTERPRETER)
        acc = _nvfp4_dot(acc, w_rows, s_rows, h0, h1, h2, h3, k0, inter_size, BLOCK_K, EVEN_K, INTERPRETER)
        if kk == k_steps - 1:
            y = acc * (gs * route_w[None, :])
            y_ptrs = y_ptr + pair_safe[None, :] * stride_yt + offs_n[:, None]
            tl.store(y_ptrs, _round_to(y, y_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[None, :] & n_ok[:, None])


@triton.jit
def gemm1_flat_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    wgs_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    h_ptr,
    num_pairs,
    top_k,
    inter_size,
    hidden_size,
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_gsg,
    stride_ht,
    gate_row0,
    up_row0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)
    pair, row_ok = _block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)
    x_rows = x_ptr + token * stride_xt
    w_base = w_ptr + expert * stride_we
    s_base = ws_ptr + expert * stride_se
    gs_gate = tl.load(wgs_ptr + expert * stride_gse) * 128.0
    gs_up = tl.load(wgs_ptr + expert * stride_gse + stride_gsg) * 128.0
    n_tiles = tl.cdiv(inter_size, BLOCK_N)
    k_steps = tl.cdiv(hidden_size, BLOCK_K)
    n_programs = tl.num_programs(1)
    my_tiles = tl.cdiv(n_tiles - pid_n, n_programs)
    tl.assume(k_steps > 0)
    tl.assume(my_tiles > 0)
    acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(0, my_tiles * k_steps):
        tile = pid_n + (step // k_steps) * n_programs
        kk = step % k_steps
        k0 = kk * BLOCK_K
        offs_n, n_ok, offs_n_safe = _tile_columns(tile, inter_size, BLOCK_N)
        wg_rows = w_base + (gate_row0 + offs_n_safe) * stride_wn
        wu_rows = w_base + (up_row0 + offs_n_safe) * stride_wn
        sg_rows = s_base + (gate_row0 + offs_n_safe) * stride_sn
        su_rows = s_base + (up_row0 + offs_n_safe) * stride_sn
        if kk == 0:
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        x0, x1, x2, x3 = _load_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K, EVEN_K, INTERPRETER)
        acc_g = _nvfp4_dot(acc_g, wg_rows, sg_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, INTERPRETER)
        acc_u = _nvfp4_dot(acc_u, wu_rows, su_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, INTERPRETER)
        if kk == k_steps - 1:
            gate = acc_g * gs_gate
            up = acc_u * gs_up
            hv = gate / (1.0 + tl.exp(-gate)) * up
            h_rows = tl.where(row_ok, pair, 0).to(tl.int64)
            h_ptrs = h_ptr + h_rows[None, :] * stride_ht + _permuted_column(offs_n)[:, None]
            tl.store(h_ptrs, _round_to(hv, h_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[None, :] & n_ok[:, None])
