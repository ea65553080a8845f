"""The W4A16 kernels' weight decode: NVFP4 codes and block scales to 16-bit values, and the K step of four
quarter-width dots that the Triton GEMMs (``nvfp4_moe``) and the dense prefill's dequantization build on.

A K step reads each weight row's packed 16-bit words (word c: K elements 4c .. 4c + 3, one a nibble) and decodes
them into four quarter tiles, quarter q holding code q of every word, each dotted with the activation columns
4c + q (``load_quarters``, in the permuted K order that ``nvfp4_moe``'s docstring describes).

Decode (``decode_nvfp4``): a nibble's three magnitude bits placed at the bottom of the 16-bit
type's exponent and the top of its mantissa, and its sign at bit 15, are exactly e2m1 * 2^-14
(fp16) or e2m1 * 2^-126 (bf16), subnormals included. Times the block scale, converted once per
group of 16 to scale * 2^7 (fp16) or scale * 2^119 (bf16), that gives e2m1 * scale * 2^-7 in both
types, exact (at most 6 significant bits, >= 2^-17). On the GPU this is inline PTX on 32-bit
registers holding two words, one call per code position: shifts and ands / lop3s place both lanes,
and one packed multiply applies the scales. With LAYOUT 0 every output depends only on the word and
scale at its own position, so the result is right in whatever register layout the compiler gives the
tile. With LAYOUT 1 and 2 the asm takes one 32-bit scale code per register and applies it to both words:
right only when a register's two words belong to one block of 16, as in the dot-operand layouts Triton
gives most tiles (kWidth 2 on sm_90, 4 on sm_120). Some tiles get another layout (Triton 3.8, sm_90,
16x64x64-w4: registers pairing word slots c and c + 2, two blocks in kernel_wgmma), so the compiled
layout is read from the TTGIR (``variants.w4a16_pairs``): the tuner refuses a tile that pairs two blocks,
CI checks the shipped and heuristic tiles, and the op checks each GEMM kernel it launches once (raising
where the pairs are wrong). The epilogue multiplies by global_scale * 2^7 (``DECODE_UNSCALE``).

``LAYOUT`` says where the codes' bits sit in a word and what the block scales are: 0, the
checkpoint's (code q at bits 4q .. 4q + 3, e4m3 scales: 15 integer operations per register of 8
codes, about 5 instructions per scale); 1, the kernel layout that ``nvfp4.to_kernel_layout`` writes once
at load time (11 per register for a bf16 decode, 15 for fp16, and one multiply-add per scale code).
gemm1 16x128x256-w4-s3 for sm_90 (Triton 3.6): 1361 instructions a K step against 1817. 2,
"kernel_wgmma": layout 1 with the words of each group of 16 reordered so that the four words a wgmma
register operand gives a thread (2t, 2t + 1, 2t + 8, 2t + 9) are one block's: the compiler loads and
expands one scale code for the two registers (sm_90, Triton 3.8: 1310 instructions a K step against 1374,
232 registers against 251). SM120's mma.sync operand already gives a thread four adjacent words, so there
layout 1 is the one (layout 2 would take 1629 against 1532).

``INTERPRETER``: inline PTX cannot run in the Triton interpreter, so there the decode is the same arithmetic in
Triton ops, and both dot operands are upcast to fp32 (``nvfp4_moe``).
"""

import triton
import triton.language as tl

from sglang_glm5.nvfp4 import WORD_BITS

# Weights are decoded as value * 2^-7: the epilogue multiplies by 2^7.
DECODE_UNSCALE = 2.0**7

# Inputs: $1 = two 16-bit words of packed weights, the register's elements 2i (low half) and 2i + 1 (high
# half) in the compiler's layout (adjacent words c and c + 1 in the dot-operand layouts), each holding
# 4 codes = K elements 4c .. 4c + 3; $2 = their block scales as a packed pair of 16-bit floats
# (checkpoint layout) or of scale codes (kernel layout, ``nvfp4.scale_codes``). Output = the pair
# (code q of element c, code q of element c + 1): the two lanes are 16 bits apart in the input as in the
# output, so one shift moves both.


def decode_ptx(bf16: bool, q: int, layout: int) -> str:
    # Where code q's bits go: magnitude (mantissa, exponent low, exponent high) at bits 6-8 (bf16) or
    # 9-11 (fp16), sign at 15; where they are: nvfp4.WORD_BITS. Bits that move by the same shift go
    # together: one shift (none for 0) and one and / lop3 each.
    target = (6, 7, 8, 15) if bf16 else (9, 10, 11, 15)
    shifts: dict[int, int] = {}
    for src, dst in zip(WORD_BITS[layout][q], target, strict=True):
        shifts[dst - src] = shifts.get(dst - src, 0) | (1 << dst) | (1 << (dst + 16))
    lines = ["{", ".reg .b32 m, t, s, z;", "mov.b32 z, 0x80008000;"]  # z = (-0, -0): x * y + z = x * y
    if layout == 0:
        lines.append("mov.b32 s, $2;")
    else:  # code * 16 + 0x7600 = scale * 2^119 (bf16), code * 128 + 0x3000 = scale * 2^7 (fp16), per lane
        # $2 is one 32-bit code (both words of a register share their block): one multiply-add fills both lanes
        mad = "0x00100010, 0x76007600" if bf16 else "0x00800080, 0x30003000"
        lines.append(f"mad.lo.u32 s, $2, {mad};")
    for i, (shift, mask) in enumerate(sorted(shifts.items(), key=lambda kv: kv[0] != 0)):
        word = "$1" if shift == 0 else "t"
        if shift:
            lines.append(f"shl.b32 t, $1, {shift};" if shift > 0 else f"shr.b32 t, $1, {-shift};")
        # the first group: m = word & mask; the next: m |= word & mask (lop3 0xF8: a | (b & c))
        lines.append(f"and.b32 m, {word}, {mask:#010x};" if i == 0 else f"lop3.b32 m, m, {word}, {mask:#010x}, 0xF8;")
    # fma rather than mul: mul.bf16x2 needs sm_90, fma.rn.bf16x2 sm_80.
    lines.append(f"fma.rn.{'bf16x2' if bf16 else 'f16x2'} $0, m, s, z;")
    return "\n".join(lines + ["}"])


# _DECODE_PTX[layout * 8 + bf16 * 4 + q]
_DECODE_PTX = tl.constexpr(
    tuple(decode_ptx(bf16, q, layout) for layout in range(len(WORD_BITS)) for bf16 in (False, True) for q in range(4))
)
# Bit positions of code q's mantissa, exponents and sign: _WORD_BITS[layout * 16 + q * 4 + role]
_WORD_BITS = tl.constexpr(tuple(bit for layout in WORD_BITS for code in layout for bit in code))


@triton.jit
def _decode_asm(packed, scale, PTX: tl.constexpr, F16: tl.constexpr, CODES: tl.constexpr):
    """One quarter (one code position) of a packed tile, decoded and scaled by ``_DECODE_PTX[PTX]``.

    One call per quarter rather than one four-output call: Triton 3.8 gave a four-output call's
    results two layouts, decoding in both and sending three quarters through shared memory on their
    way to the dot (gemm1 16x128x256-w4-s3 for sm_120: 139264 B of shared memory against 90112, 2540
    instructions a K step against 1889; Triton 3.6 compiles both forms alike)."""
    # CODES: int32 scale codes, two registers per call ($2, $3; the same code); else a packed 16-bit pair
    return tl.inline_asm_elementwise(
        _DECODE_PTX[PTX], "=r,r,r,r" if CODES else "=r,r,r", [packed, scale], dtype=tl.float16 if F16 else tl.bfloat16,
        is_pure=True, pack=2,
    )  # fmt: skip


@triton.jit
def code_of_word(packed, Q: tl.constexpr, LAYOUT: tl.constexpr):
    """int16 words -> code Q of each (0..15), from the layout's bit positions (interpreter path)."""
    base: tl.constexpr = LAYOUT * 16 + Q * 4
    code = (packed >> _WORD_BITS[base]) & 1
    code |= ((packed >> _WORD_BITS[base + 1]) & 1) << 1
    code |= ((packed >> _WORD_BITS[base + 2]) & 1) << 2
    return code | (((packed >> _WORD_BITS[base + 3]) & 1) << 3)


@triton.jit
def e2m1_nibbles_to_f16(nib):
    """int16 nibbles (0..15) -> fp16 e2m1 value * 2^-14."""
    bits = ((nib & 0x7) << 9) | ((nib & 0x8) << 12)
    return bits.to(tl.float16, bitcast=True)


@triton.jit
def decode_nvfp4(
    packed,  # [BLOCK_N, BLOCK_K // 4] int16, four e2m1 codes per element (K elements 4c .. 4c + 3)
    sbyte,  # [BLOCK_N, BLOCK_K // 16] uint8: e4m3 block scales (LAYOUT 0) or scale codes (LAYOUT 1, 2)
    DTYPE: tl.constexpr,  # tl.bfloat16 or tl.float16: the activations' type
    LAYOUT: tl.constexpr,  # 0: the checkpoint's; 1, 2: the kernel layouts (nvfp4.to_kernel_layout)
    INTERPRETER: tl.constexpr,
):
    """-> four [BLOCK_N, BLOCK_K // 4] tiles, tile q holding K elements 4c + q: e2m1 * scale * 2^-7
    (DTYPE on the GPU, fp32 in the interpreter)."""
    BLOCK_N: tl.constexpr = packed.shape[0]
    QUARTER: tl.constexpr = packed.shape[1]
    F16: tl.constexpr = INTERPRETER or DTYPE == tl.float16
    if LAYOUT >= 1:
        # a scale code (nvfp4.scale_codes); the asm turns it into a 16-bit float (the interpreter here)
        if INTERPRETER:
            scale = (sbyte.to(tl.int16) * 128 + 0x3000).to(tl.float16, bitcast=True)  # scale * 2^7
        else:
            scale = sbyte.to(tl.int32)
    else:
        # e4m3 byte placed into an fp16 is scale * 2^-8, exactly, subnormals included. The sign bit is
        # dropped: block scales are >= 0.
        scale = ((sbyte.to(tl.int16) << 7) & 0x3F80).to(tl.float16, bitcast=True)
        if F16:
            scale = scale * 32768.0  # scale * 2^7 <= 57344: exact in fp16
        else:
            scale = (scale.to(tl.float32) * 1.7014118346046923e38).to(tl.bfloat16)  # * 2^127: scale * 2^119
    if LAYOUT == 2:  # "kernel_wgmma": block b of each 16 words is word slots 2b, 2b + 1, 2b + 8, 2b + 9
        scale = tl.reshape(scale, (BLOCK_N, QUARTER // 16, 1, 4, 1))
        scale = tl.reshape(tl.broadcast_to(scale, (BLOCK_N, QUARTER // 16, 2, 4, 2)), (BLOCK_N, QUARTER))
    else:  # block b is words 4b .. 4b + 3
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, QUARTER // 4, 4)), (BLOCK_N, QUARTER))
    if INTERPRETER:  # the same values through fp16 arithmetic
        q0 = (e2m1_nibbles_to_f16(code_of_word(packed, 0, LAYOUT)) * scale).to(tl.float32)
        q1 = (e2m1_nibbles_to_f16(code_of_word(packed, 1, LAYOUT)) * scale).to(tl.float32)
        q2 = (e2m1_nibbles_to_f16(code_of_word(packed, 2, LAYOUT)) * scale).to(tl.float32)
        q3 = (e2m1_nibbles_to_f16(code_of_word(packed, 3, LAYOUT)) * scale).to(tl.float32)
        return q0, q1, q2, q3
    else:
        base: tl.constexpr = LAYOUT * 8 + (0 if F16 else 4)
        q0 = _decode_asm(packed, scale, base, F16, LAYOUT >= 1)
        q1 = _decode_asm(packed, scale, base + 1, F16, LAYOUT >= 1)
        q2 = _decode_asm(packed, scale, base + 2, F16, LAYOUT >= 1)
        q3 = _decode_asm(packed, scale, base + 3, F16, LAYOUT >= 1)
        return q0, q1, q2, q3


@triton.jit
def load_quarters(
    rows_ptr,  # [BLOCK_M] pointers to activation rows in the permuted K order
    k0,
    row_ok,  # [BLOCK_M]
    K,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    LAYOUT: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """-> four [BLOCK_K // 4, BLOCK_M] tiles of K step k0, transposed; tile q holds K columns 4c + q."""
    # a quarter's adjacent columns: 16 in the kernel_wgmma K order (period 64), else 8 (period 32)
    RUN: tl.constexpr = 8 + 8 * (LAYOUT == 2)
    cols = tl.arange(0, BLOCK_K // 4)
    # the column of word slot c's code 0 (in its group of 4 * RUN positions); code q's lies RUN * q further
    pos = k0 + (cols // RUN) * (4 * RUN) + cols % RUN
    mask = row_ok[None, :] if EVEN_K else row_ok[None, :] & (pos < K)[:, None]
    ptrs = rows_ptr[None, :] + pos[:, None]
    x0 = tl.load(ptrs, mask=mask, other=0.0)
    x1 = tl.load(ptrs + RUN, mask=mask, other=0.0)
    x2 = tl.load(ptrs + 2 * RUN, mask=mask, other=0.0)
    x3 = tl.load(ptrs + 3 * RUN, mask=mask, other=0.0)
    if INTERPRETER:
        return x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    else:
        return x0, x1, x2, x3


@triton.jit
def weight_tile(
    w_rows_ptr,  # [BLOCK_N] int16 pointers to the first packed element of each weight row
    s_rows_ptr,  # [BLOCK_N] pointers to the first scale byte of each weight row
    k0,
    K,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    DTYPE: tl.constexpr,
    LAYOUT: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """Load and decode K step k0 of BLOCK_N weight rows -> four [BLOCK_N, BLOCK_K // 4] tiles (decode_nvfp4)."""
    # k0 is a multiple of BLOCK_K (>= 64): the hints let the loads be 16-byte vectors.
    elems = tl.multiple_of(k0 // 4, 16) + tl.arange(0, BLOCK_K // 4)
    groups = tl.multiple_of(k0 // 16, BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    if EVEN_K:
        packed = tl.load(w_rows_ptr[:, None] + elems[None, :])
        sbyte = tl.load(s_rows_ptr[:, None] + groups[None, :])
    else:
        packed = tl.load(w_rows_ptr[:, None] + elems[None, :], mask=(elems < K // 4)[None, :], other=0)
        sbyte = tl.load(s_rows_ptr[:, None] + groups[None, :], mask=(groups < K // 16)[None, :], other=0)
    return decode_nvfp4(packed, sbyte, DTYPE, LAYOUT, INTERPRETER)


@triton.jit
def nvfp4_dot(
    acc,  # [BLOCK_N, BLOCK_M] fp32
    w_rows_ptr,  # [BLOCK_N] int16 pointers to the weight rows
    s_rows_ptr,  # [BLOCK_N] pointers to their scale rows
    x0,  # [BLOCK_K // 4, BLOCK_M] activation columns 4c + 0 of K step k0 (load_quarters)
    x1,
    x2,
    x3,
    k0,
    K,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    LAYOUT: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """acc + (decoded weights of K step k0) @ (activations of K step k0): four quarter-width dots."""
    DTYPE: tl.constexpr = x0.dtype
    w0, w1, w2, w3 = weight_tile(w_rows_ptr, s_rows_ptr, k0, K, BLOCK_K, EVEN_K, DTYPE, LAYOUT, INTERPRETER)
    acc = tl.dot(w0, x0, acc)
    acc = tl.dot(w1, x1, acc)
    acc = tl.dot(w2, x2, acc)
    return tl.dot(w3, x3, acc)
