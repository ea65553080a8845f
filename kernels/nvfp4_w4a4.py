"""Triton kernels of the NVFP4 W4A4 fused-MoE path: both GEMM operands NVFP4, block-scaled FP4 tensor cores.

On sm_120 ``tl.dot_scaled(a, a_scale, "e2m1", b, b_scale, "e2m1")`` with one e4m3 scale per 16
elements along K lowers to ``mma.sync ... kind::mxf4nvf4.block_scale`` (checked by the AOT test).
Data flow (P = T * top_k pairs, sorted into blocks of BLOCK_M pairs of one expert, as in nvfp4_moe):

    quant:  xq, xs = nvfp4(x[t, :], global scale a1)                              -> [T, H/2], [T, H/16]
    gemm1:  g, u   = (xq @ Wg^T) * a1 * gs_gate, (xq @ Wu^T) * a1 * gs_up        (fp32 accumulators)
            hq, hs = nvfp4(silu(g) * u, global scale a2[e])                        -> [P, I/2], [P, I/16]
    gemm2:  y[p]   = topk_weight[p] * (hq @ W2^T) * a2[e] * gs2[e]                -> [P, H]
    reduce: out[t] = sum of y over the valid slots (nvfp4_moe.moe_sum_kernel)

a1 and a2 are the checkpoint's ``input_scale`` values (ModelOpt): global scales that multiply, so a
block scale is amax(block) / 6 / a, rounded to e4m3, and a code is x / (scale * a) rounded to the
nearest e2m1 (ties to even). ``sglang_glm5.w4a4`` holds the torch emulation of exactly this math.

Packing: byte i of a row holds elements 2i (low nibble) and 2i+1 (high nibble), for activations as
for ModelOpt weights, which is what ``dot_scaled`` expects for e2m1 packed along K (k_pack=True).
Weights are loaded [BLOCK_N, BLOCK_K/2] and transposed to the [K/2, N] operand; scales stay [N, K/16].

``EMULATE_DOT`` replaces ``dot_scaled`` by decode-to-fp32 and ``tl.dot``: the Triton interpreter
decodes every ``dot_scaled`` scale as e8m0 (FACTS.md), so the CPU tests check the rest of the kernel
logic (indexing, quantization, epilogues) this way; only the compiled path uses ``dot_scaled``.
"""

import triton
import triton.language as tl

from sglang_glm5.kernels.moe_common import block_pairs, expert_rows, round_to, tile_columns
from sglang_glm5.kernels.nvfp4_decode import e2m1_nibbles_to_f16


@triton.jit
def _e4m3_to_f32(sbyte):
    """uint8 e4m3fn bytes -> fp32 values (the bits placed into an fp16 are value * 2^-8, exactly)."""
    s = sbyte.to(tl.int16)
    bits = ((s & 0x7F) << 7) | ((s & 0x80) << 8)
    return bits.to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def _decode_rows(packed, sbyte):
    """packed [R, C/2] uint8 with scales [R, C/16] uint8 -> fp32 [R, C] (e2m1 * e4m3, exact in fp32)."""
    R: tl.constexpr = packed.shape[0]
    C: tl.constexpr = packed.shape[1] * 2
    p = packed.to(tl.int16)
    lo = e2m1_nibbles_to_f16(p & 0xF).to(tl.float32) * 16384.0  # nibble decode gives value * 2^-14
    hi = e2m1_nibbles_to_f16(p >> 4).to(tl.float32) * 16384.0
    vals = tl.reshape(tl.join(lo, hi), (R, C // 16, 16))
    return tl.reshape(vals * _e4m3_to_f32(sbyte)[:, :, None], (R, C))


@triton.jit
def _scaled_dot(a, a_scale, w, w_scale, acc, EMULATE_DOT: tl.constexpr):
    """acc + decode(a) @ decode(w)^T; a [M, K/2], a_scale [M, K/16], w [N, K/2], w_scale [N, K/16], uint8."""
    if EMULATE_DOT:
        return tl.dot(_decode_rows(a, a_scale), tl.trans(_decode_rows(w, w_scale)), acc, input_precision="ieee")
    else:
        # The scale dtype picks the format: uint8 scales are taken as e8m0 per 32 (mxfp4, scale_vec::2X);
        # float8e4nv scales per 16 give nvfp4 (ue4m3, scale_vec::4X).
        a_s = a_scale.to(tl.float8e4nv, bitcast=True)
        w_s = w_scale.to(tl.float8e4nv, bitcast=True)
        return tl.dot_scaled(a, a_s, "e2m1", tl.trans(w), w_s, "e2m1", acc, rhs_k_pack=True)


@triton.jit
def _f32_to_e4m3_byte(s):
    """fp32 in [0, 448] -> e4m3fn byte, round to nearest even, by hand: the Triton interpreter's fp8 cast
    rounded ~5% of scales differently from torch, and bit arithmetic is the same everywhere."""
    bits = s.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & ~0xFFFFF  # keep 3 mantissa bits, ties to even
    normal = (((bits >> 23) - 120) << 3) | ((bits >> 20) & 0x7)  # exponent bias 127 -> 7
    sub = ((s * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # below 2^-6: multiples of 2^-9, rint by 2^23
    return tl.where(s < 0.015625, sub, normal).to(tl.uint8)


@triton.jit
def _quantize_rows(v, global_scale):
    """fp32 [R, C] (C a multiple of 16) -> (packed [R, C/2] uint8, scales [R, C/16] uint8 e4m3 bits).

    global_scale: fp32 scalar or [R, 1]. Same rounding as sglang_glm5.nvfp4.quantize: the e4m3 scale
    rounds to nearest even (saturating at 448), the code to the nearest e2m1, ties to even.
    """
    R: tl.constexpr = v.shape[0]
    C: tl.constexpr = v.shape[1]
    blocks = tl.reshape(v, (R, C // 16, 16))
    amax = tl.max(tl.abs(blocks), axis=2)
    s = tl.minimum(tl.math.div_rn(tl.math.div_rn(amax, 6.0), global_scale + tl.zeros_like(amax)), 448.0)
    s8 = _f32_to_e4m3_byte(s)
    denom = _e4m3_to_f32(s8) * global_scale
    safe = tl.where(denom > 0, denom, 1.0)
    q = tl.where(denom[:, :, None] > 0, tl.math.div_rn(blocks, safe[:, :, None]), 0.0)
    mag = tl.abs(q)
    # Midpoints between e2m1 magnitudes; ">" keeps a tie on the even code below, ">=" moves it up.
    code = (
        (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
        + (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
        + (mag > 5.0).to(tl.int32)
    )  # fmt: skip
    code = code | tl.where((q < 0) & (code > 0), 8, 0)
    lo, hi = tl.split(tl.reshape(code, (R, C // 2, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    return packed, s8


@triton.jit
def nvfp4_quantize_kernel(
    x_ptr,  # [T, K] bf16/fp16 activations
    global_scale_ptr,  # [] fp32, the checkpoint's input_scale (multiplies)
    xq_ptr,  # [T, K/2] uint8 out, packed e2m1
    xs_ptr,  # [T, K/16] uint8 out, e4m3 block scales
    num_rows,  # T
    K,  # a multiple of 16
    stride_xt,
    stride_qt,
    stride_st,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a multiple of 16
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    t_ok = offs_t < num_rows
    rows = offs_t.to(tl.int64)
    x_mask = t_ok[:, None] & (offs_k < K)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xt + offs_k[None, :], mask=x_mask, other=0.0)
    packed, scales = _quantize_rows(x.to(tl.float32), tl.load(global_scale_ptr))
    offs_b = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    offs_g = tl.program_id(1) * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    b_mask = t_ok[:, None] & (offs_b < K // 2)[None, :]
    g_mask = t_ok[:, None] & (offs_g < K // 16)[None, :]
    tl.store(xq_ptr + rows[:, None] * stride_qt + offs_b[None, :], packed, mask=b_mask)
    tl.store(xs_ptr + rows[:, None] * stride_st + offs_g[None, :], scales, mask=g_mask)


@triton.jit
def _load_rows(rows_ptr, row_ok, col0, ncols, WIDTH: tl.constexpr):
    """[R, WIDTH] bytes from row pointers, columns col0.., zero outside row_ok and ncols."""
    offs = col0 + tl.arange(0, WIDTH)
    return tl.load(rows_ptr[:, None] + offs[None, :], mask=row_ok[:, None] & (offs < ncols)[None, :], other=0)


@triton.jit
def nvfp4_w4a4_gemm1_kernel(
    xq_ptr,  # [T, H/2] uint8, activations quantized by nvfp4_quantize_kernel
    xs_ptr,  # [T, H/16] uint8 e4m3
    a1_ptr,  # [] fp32, the global scale the activations were quantized with
    w_ptr,  # [E, 2I, H/2] uint8, packed e2m1
    ws_ptr,  # [E, 2I, H/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E, 2] fp32 global scales (gate, up), addressed by strides
    a2_ptr,  # [E] fp32, w2's input scale: the global scale of the intermediate
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32 expert of each block, -1 = no work
    hq_ptr,  # [P, I/2] uint8 out, packed e2m1 intermediate
    hs_ptr,  # [P, I/16] uint8 out, e4m3 block scales
    num_pairs,  # P = T * top_k
    top_k,
    inter_size,  # I, a multiple of 16
    hidden_size,  # H (the K of this GEMM), a multiple of 16
    stride_xqt,
    stride_xst,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_gsg,  # 0 when one global scale serves gate and up
    stride_a2e,  # 0 when one input scale serves every expert
    stride_hqt,
    stride_hst,
    gate_row0,  # first w13 row of the gate half: 0 ("gate_up") or I ("up_gate")
    up_row0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # a multiple of 16: the epilogue quantizes whole groups of 16
    BLOCK_K: tl.constexpr,
    EMULATE_DOT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)

    pair, row_ok, pair_safe = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)

    offs_n, n_ok, offs_n_safe = tile_columns(pid_n, inter_size, BLOCK_N)
    wg_rows, sg_rows = expert_rows(w_ptr, ws_ptr, expert, gate_row0 + offs_n_safe, stride_we, stride_wn, stride_se,
                                   stride_sn)  # fmt: skip
    wu_rows, su_rows = expert_rows(w_ptr, ws_ptr, expert, up_row0 + offs_n_safe, stride_we, stride_wn, stride_se,
                                   stride_sn)  # fmt: skip
    xq_rows = xq_ptr + token * stride_xqt
    xs_rows = xs_ptr + token * stride_xst

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        a = _load_rows(xq_rows, row_ok, k0 // 2, hidden_size // 2, BLOCK_K // 2)
        a_s = _load_rows(xs_rows, row_ok, k0 // 16, hidden_size // 16, BLOCK_K // 16)
        wg = _load_rows(wg_rows, n_ok, k0 // 2, hidden_size // 2, BLOCK_K // 2)
        wg_s = _load_rows(sg_rows, n_ok, k0 // 16, hidden_size // 16, BLOCK_K // 16)
        acc_g = _scaled_dot(a, a_s, wg, wg_s, acc_g, EMULATE_DOT)
        wu = _load_rows(wu_rows, n_ok, k0 // 2, hidden_size // 2, BLOCK_K // 2)
        wu_s = _load_rows(su_rows, n_ok, k0 // 16, hidden_size // 16, BLOCK_K // 16)
        acc_u = _scaled_dot(a, a_s, wu, wu_s, acc_u, EMULATE_DOT)

    a1 = tl.load(a1_ptr)
    gate = acc_g * (a1 * tl.load(wgs_ptr + expert * stride_gse))
    up = acc_u * (a1 * tl.load(wgs_ptr + expert * stride_gse + stride_gsg))
    h = gate / (1.0 + tl.exp(-gate)) * up
    h = tl.where(n_ok[None, :], h, 0.0)
    packed, scales = _quantize_rows(h, tl.load(a2_ptr + expert * stride_a2e))

    offs_b = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    offs_g = pid_n * (BLOCK_N // 16) + tl.arange(0, BLOCK_N // 16)
    b_mask = row_ok[:, None] & (offs_b < inter_size // 2)[None, :]
    g_mask = row_ok[:, None] & (offs_g < inter_size // 16)[None, :]
    tl.store(hq_ptr + pair_safe[:, None] * stride_hqt + offs_b[None, :], packed, mask=b_mask)
    tl.store(hs_ptr + pair_safe[:, None] * stride_hst + offs_g[None, :], scales, mask=g_mask)


@triton.jit
def nvfp4_w4a4_gemm2_kernel(
    hq_ptr,  # [P, I/2] uint8, packed e2m1 intermediate from gemm1
    hs_ptr,  # [P, I/16] uint8 e4m3
    a2_ptr,  # [E] fp32, w2's input scale (the intermediate's global scale)
    w_ptr,  # [E, H, I/2] uint8, packed e2m1
    ws_ptr,  # [E, H, I/16] uint8, e4m3 block scales (linear layout)
    wgs_ptr,  # [E] fp32 global scales
    topk_weights_ptr,  # [P] fp32, flattened [T, k]
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 pair ids, >= num_pairs = padding
    block_expert_ptr,  # [num_blocks] int32, -1 = no work
    y_ptr,  # [P, H] out, bf16/fp16
    num_pairs,
    hidden_size,  # H (the N of this GEMM)
    inter_size,  # I (the K of this GEMM), a multiple of 16
    stride_hqt,
    stride_hst,
    stride_a2e,  # 0 when one input scale serves every expert
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EMULATE_DOT: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)

    pair, row_ok, pair_safe = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)

    offs_n, n_ok, offs_n_safe = tile_columns(pid_n, hidden_size, BLOCK_N)
    w_rows, s_rows = expert_rows(w_ptr, ws_ptr, expert, offs_n_safe, stride_we, stride_wn, stride_se, stride_sn)
    hq_rows = hq_ptr + pair_safe * stride_hqt
    hs_rows = hs_ptr + pair_safe * stride_hst

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        a = _load_rows(hq_rows, row_ok, k0 // 2, inter_size // 2, BLOCK_K // 2)
        a_s = _load_rows(hs_rows, row_ok, k0 // 16, inter_size // 16, BLOCK_K // 16)
        w = _load_rows(w_rows, n_ok, k0 // 2, inter_size // 2, BLOCK_K // 2)
        w_s = _load_rows(s_rows, n_ok, k0 // 16, inter_size // 16, BLOCK_K // 16)
        acc = _scaled_dot(a, a_s, w, w_s, acc, EMULATE_DOT)

    alpha = tl.load(a2_ptr + expert * stride_a2e) * tl.load(wgs_ptr + expert)
    route_w = tl.load(topk_weights_ptr + pair_safe, mask=row_ok, other=0.0)
    y = acc * (alpha * route_w[:, None])
    y_ptrs = y_ptr + pair_safe[:, None] * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, round_to(y, y_ptr.dtype.element_ty, INTERPRETER), mask=row_ok[:, None] & n_ok[None, :])
