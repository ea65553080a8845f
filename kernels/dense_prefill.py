"""Triton kernels of the dense prefill path (``sglang_glm5.prefill``).

    dequant:    out[r, k] = e2m1(code k of row r) * scale[r, k // 16]              (no global scale)
                codes read as 16-bit words of 4 in any layout (nvfp4.LAYOUTS)
    activation: h[row] = silu(gate * gs_gate) * up * gs_up * topk_weight * gs2      (per sorted row)

The product of an e2m1 value (2 significant bits) and an e4m3 scale (4 bits) has at most 6
significant bits and lies in [2^-10, 2688]: it is exact in bf16. The per-expert global scale is
applied to the GEMM outputs instead, so dequantization adds no rounding.
"""

import triton
import triton.language as tl

from sglang_glm5.kernels.nvfp4_decode import code_of_word, e2m1_nibbles_to_f16


@triton.jit
def nvfp4_dequant_kernel(
    w_ptr,  # [R, K/2] uint8, packed e2m1 (R = experts * rows, contiguous), read as [R, K/4] 16-bit words
    ws_ptr,  # [R, K/16] uint8, e4m3 block scales (linear layout); scale codes with LAYOUT 1 or 2
    out_ptr,  # [R, K] bf16
    num_rows,
    K,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LAYOUT: tl.constexpr,  # 0: the checkpoint's; 1, 2: the W4A16 kernel layouts (nvfp4.to_kernel_layout)
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    words = tl.program_id(1) * (BLOCK_K // 4) + tl.arange(0, BLOCK_K // 4)
    groups = tl.program_id(1) * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    r_ok = rows < num_rows
    rows = rows.to(tl.int64)
    packed = tl.load(
        w_ptr.to(tl.pointer_type(tl.int16)) + rows[:, None] * (K // 4) + words[None, :],
        mask=r_ok[:, None] & (words < K // 4)[None, :],
    )
    if LAYOUT == 2:  # "kernel_wgmma" (K % 64 == 0): slot 16g + 8h + 2b + i holds word 16g + 4b + 2h + i
        packed = tl.permute(tl.reshape(packed, (BLOCK_R, BLOCK_K // 64, 2, 4, 2)), (0, 1, 3, 2, 4))
        packed = tl.reshape(packed, (BLOCK_R, BLOCK_K // 4))
    sbyte = tl.load(
        ws_ptr + rows[:, None] * (K // 16) + groups[None, :], mask=r_ok[:, None] & (groups < K // 16)[None, :]
    ).to(tl.int16)
    # Codes give e2m1 * 2^-14 (e2m1_nibbles_to_f16). An e4m3 byte placed into an fp16 is scale * 2^-8; a
    # scale code * 128 + 0x3000 as fp16 is scale * 2^7 (nvfp4.scale_codes). Both undone in fp32.
    if LAYOUT >= 1:
        scale = (sbyte * 128 + 0x3000).to(tl.float16, bitcast=True).to(tl.float32) * (16384.0 / 128.0)
    else:
        sbits = ((sbyte & 0x7F) << 7) | ((sbyte & 0x80) << 8)
        scale = sbits.to(tl.float16, bitcast=True).to(tl.float32) * (256.0 * 16384.0)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_R, BLOCK_K // 16, 4)), (BLOCK_R, BLOCK_K // 4))
    c0 = e2m1_nibbles_to_f16(code_of_word(packed, 0, LAYOUT)).to(tl.float32) * scale
    c1 = e2m1_nibbles_to_f16(code_of_word(packed, 1, LAYOUT)).to(tl.float32) * scale
    c2 = e2m1_nibbles_to_f16(code_of_word(packed, 2, LAYOUT)).to(tl.float32) * scale
    c3 = e2m1_nibbles_to_f16(code_of_word(packed, 3, LAYOUT)).to(tl.float32) * scale
    # word w holds K elements 4w .. 4w + 3: [..., w, a, b] = c(2a + b)
    w = tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (BLOCK_R, BLOCK_K)).to(tl.bfloat16)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows[:, None] * K + offs_k[None, :], w, mask=r_ok[:, None] & (offs_k < K)[None, :])


@triton.jit
def dense_activation_kernel(
    gu_ptr,  # [R, 2I] bf16, x_sorted @ (e2m1 * scale)^T of w13, rows sorted by expert
    row_expert_ptr,  # [R] int32 expert of each row, -1 = padding
    sorted_ids_ptr,  # [R] int32 pair id of each row
    wgs13_ptr,  # [E, 2] fp32 global scales (gate, up), addressed by strides
    wgs2_ptr,  # [E] fp32
    topk_weights_ptr,  # [P] fp32
    h_ptr,  # [R, I] bf16 out
    inter_size,
    stride_gur,
    stride_gse,
    stride_gsg,  # 0 when one global scale serves gate and up
    stride_hr,
    gate_col0,  # first column of the gate half of gu: 0 or I
    up_col0,
    BLOCK_I: tl.constexpr,
):
    """One row per program (axis 0), BLOCK_I columns per program (axis 1). Padding rows (past the
    grouped GEMM's last group) are skipped: nothing reads them."""
    row = tl.program_id(0).to(tl.int64)
    expert = tl.load(row_expert_ptr + row)
    if expert < 0:
        return
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok = cols < inter_size
    e = expert.to(tl.int64)
    pair = tl.load(sorted_ids_ptr + row).to(tl.int64)
    gs_gate = tl.load(wgs13_ptr + e * stride_gse)
    gs_up = tl.load(wgs13_ptr + e * stride_gse + stride_gsg)
    route = tl.load(topk_weights_ptr + pair) * tl.load(wgs2_ptr + e)
    gate = tl.load(gu_ptr + row * stride_gur + gate_col0 + cols, mask=ok, other=0.0).to(tl.float32) * gs_gate
    up = tl.load(gu_ptr + row * stride_gur + up_col0 + cols, mask=ok, other=0.0).to(tl.float32) * gs_up
    h = gate / (1.0 + tl.exp(-gate)) * up * route
    tl.store(h_ptr + row * stride_hr + cols, h.to(tl.bfloat16), mask=ok)
