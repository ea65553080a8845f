"""NVFP4 (ModelOpt format): quantize, pack, unpack, dequantize, and block-scale layouts.

The single source of truth for the format used by the kernels, the reference and the tests.

    value = e2m1(code) * scale[row, k // 16] * global_scale

- ``packed``: uint8 [..., K/2], two e2m1 codes per byte, element 2i in the low nibble.
  A code is sign (bit 3), exponent (bits 2-1), mantissa (bit 0); magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
- ``scale``: float8_e4m3fn [..., K/16], one per 16 consecutive elements along K ("linear" layout).
- ``global_scale``: fp32, one per tensor (ModelOpt's ``weight_scale_2``); it multiplies.
  SGLang's test helpers and FlashInfer's quantizer use the reciprocal (448 * 6 / amax) and divide.

SGLang (``swizzle_blockscale``) stores block scales of MoE weights in a swizzled layout for the
CUTLASS kernels: rows padded to 128, scale columns padded to 4, then each 128 x 4 tile laid out as
[32, 4 (row group), 4 (column)]. ``swizzle_scales`` / ``unswizzle_scales`` convert between the two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16  # elements per e4m3 block scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0

# Magnitudes of the 8 non-negative e2m1 codes; codes 8..15 are their negatives.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive magnitudes: the rounding boundaries.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


@dataclass(frozen=True)
class NvFp4Tensor:
    """A quantized tensor: ``dequantize(packed, scale, global_scale)`` gives its value."""

    packed: torch.Tensor  # [..., K/2] uint8
    scale: torch.Tensor  # [..., K/16] float8_e4m3fn, linear layout
    global_scale: torch.Tensor  # [] fp32

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.packed, self.scale, self.global_scale, dtype)


def float_to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to even, saturating at +-6); returns uint8 codes 0..15."""
    mag = x.abs().float()
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = torch.bucketize(mag, mids)  # mids[idx-1] < mag <= mids[idx]: ties go down
    # A tie whose upper neighbour has the even code (mantissa bit 0) rounds up instead.
    tie = mag == mids[idx.clamp(max=len(_E2M1_MIDPOINTS) - 1)]
    idx = idx + (tie & (idx % 2 == 1)).long()
    sign = (x < 0) & (idx > 0)  # no negative zero
    return (idx | (sign.long() << 3)).to(torch.uint8)


def e2m1_codes_to_float(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 codes 0..15 -> float values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag).to(dtype)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] -> packed bytes [..., K/2], element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack: last dimension must be even, got {codes.shape[-1]}")
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """packed bytes [..., K/2] -> uint8 codes [..., K]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack: expected uint8, got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def dequantize(
    packed: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """packed [..., K/2] uint8, scale [..., K/16] e4m3 (linear), global_scale scalar -> [..., K]."""
    if scale.dtype != torch.float8_e4m3fn:
        raise TypeError(f"dequantize: scale must be float8_e4m3fn, got {scale.dtype}")
    k = packed.shape[-1] * 2
    if scale.shape[:-1] != packed.shape[:-1] or scale.shape[-1] * BLOCK_SIZE != k:
        raise ValueError(
            f"dequantize: scale shape {tuple(scale.shape)} does not match packed {tuple(packed.shape)} "
            f"(expected {(*packed.shape[:-1], k // BLOCK_SIZE)})"
        )
    work = torch.float64 if dtype == torch.float64 else torch.float32
    values = e2m1_codes_to_float(unpack(packed), work)
    block = scale.to(work).repeat_interleave(BLOCK_SIZE, dim=-1)
    gs = torch.as_tensor(global_scale, dtype=work, device=packed.device)
    return (values * block * gs).to(dtype)


def quantize(x: torch.Tensor, global_scale: torch.Tensor | float | None = None) -> NvFp4Tensor:
    """Quantize x [..., K] (K a multiple of 16) the ModelOpt way.

    global_scale defaults to amax(|x|) / (448 * 6), so the largest block scale is 448. Each block
    scale is amax(block) / 6 / global_scale rounded to e4m3; codes are x / (scale * global_scale)
    rounded to nearest e2m1, ties to even.
    """
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"quantize: last dimension must be a multiple of {BLOCK_SIZE}, got {x.shape[-1]}")
    xf = x.float()
    if global_scale is None:
        amax = xf.abs().max()
        global_scale = torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), torch.ones_like(amax))
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    blocks = xf.reshape(*xf.shape[:-1], -1, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    scale = (block_amax / E2M1_MAX / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = scale.float() * gs
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    scaled = torch.where(denom[..., None] > 0, blocks / safe[..., None], torch.zeros_like(blocks))
    codes = float_to_e2m1_codes(scaled.reshape(xf.shape))
    return NvFp4Tensor(pack(codes), scale, gs)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Linear block scales [B, M, S] (or [M, S]) -> SGLang's swizzled layout [B, M128, S4], zero padded.

    M128 is M rounded up to 128 and S4 is S rounded up to 4. Byte-identical to SGLang's
    ``swizzle_blockscale``.
    """
    squeeze = scale.dim() == 2
    s = scale.unsqueeze(0) if squeeze else scale
    if s.dim() != 3:
        raise ValueError(f"swizzle_scales: expected 2 or 3 dimensions, got shape {tuple(scale.shape)}")
    b, m, k = s.shape
    mp, kp = _round_up(m, 128), _round_up(k, 4)
    padded = torch.zeros((b, mp, kp), dtype=s.dtype, device=s.device)
    padded[:, :m, :k] = s
    tiles = padded.view(b, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = tiles.contiguous().view(b, mp, kp)
    return out[0] if squeeze else out


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Swizzled block scales [B, M128, S4] (or 2-D, or flat per batch) -> linear [B, rows, cols]."""
    squeeze = swizzled.dim() <= 2
    mp, kp = _round_up(rows, 128), _round_up(cols, 4)
    b = 1 if squeeze else swizzled.shape[0]
    if swizzled.numel() != b * mp * kp:
        raise ValueError(
            f"unswizzle_scales: {swizzled.numel()} elements cannot hold {b} x {rows} x {cols} scales "
            f"(padded to {b} x {mp} x {kp})"
        )
    tiles = swizzled.reshape(b, mp // 128, kp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = tiles.reshape(b, mp, kp)[:, :rows, :cols].contiguous()
    return out[0] if squeeze else out


# ---------------------------------------------------------------------------------------------
# The W4A16 kernels' own layout: the same values, re-encoded once when a layer's weights are loaded, so
# that a GPU without an e2m1 conversion instruction (Hopper) decodes them in fewer integer operations.
#
# The kernels read packed weights as 16-bit words, word c of a row holding K elements 4c .. 4c + 3, and
# decode code q of every word into the 16-bit type's bits: magnitude (mantissa, exponent low, exponent
# high) at bits 6, 7, 8 and sign at 15 for bf16 (the value times 2^-126, exactly). WORD_BITS[layout][q]
# lists where code q's mantissa, exponent low, exponent high and sign bits sit in the word. The
# checkpoint puts code q at bits 4q .. 4q + 3, which costs two shifts, an and and a lop3 per code and
# 32-bit register (two words). The kernel layout puts code 0 where bf16 wants it (one and), codes 1 and
# 2 one shift away (with the sign of code 2 one more), code 3 in two pieces: 11 integer operations for
# the 8 codes of a register instead of 15 (the cheapest over every way to place the 16 bits).
CHECKPOINT_WORD = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
KERNEL_WORD = ((6, 7, 8, 15), (0, 1, 2, 9), (3, 4, 5, 10), (12, 13, 14, 11))
LAYOUTS = ("checkpoint", "kernel", "kernel_wgmma")  # index = the kernels' LAYOUT switch
WORD_BITS = (CHECKPOINT_WORD, KERNEL_WORD, KERNEL_WORD)

# "kernel_wgmma" is "kernel" with the words of each group of 16 (64 K elements, 4 block scales) reordered
# for Hopper's wgmma, whose register operand gives a thread words 2t, 2t + 1, 2t + 8 and 2t + 9 of every 16:
# word slot 8h + 2b + i holds word 4b + 2h + i, so that those four slots are block b's four words and share
# one scale (one scale load and expansion for two registers instead of one each). The kernels then read
# activations in a K order of period 64 instead of 32 (``kernels/nvfp4_moe.py``): K % 64 == 0.
# SM120's mma.sync operand (kWidth 4 in Triton) gives a thread four adjacent words already.
WGMMA_GROUP_WORDS = 16

# Block scales in the kernel layout are 8-bit codes of a float with 5 exponent bits (bias 10) and 3
# mantissa bits, no sign and no subnormals: code = (e << 3) | m means 2^(e - 10) * (1 + m / 8), code 0
# means 0. Every e4m3 scale has one (e4m3 subnormals become normal numbers), and the kernels turn a
# code into a 16-bit float in one integer multiply-add (code * 16 + 0x7600 is scale * 2^119 in bf16).
# A zero scale's block decodes to zeros whatever its codes say, so those codes are set to 0.


@functools.cache
def _scale_code_table() -> torch.Tensor:
    """[128] uint8: the code of each non-negative e4m3 byte 0x00 .. 0x7E (0x7F, NaN, maps to 0xFF)."""
    table = torch.full((128,), 0xFF, dtype=torch.uint8)
    values = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    for byte in range(127):
        value = float(values[byte])
        if value == 0:
            table[byte] = 0
            continue
        exp = int(torch.floor(torch.log2(torch.tensor(value, dtype=torch.float64))))
        mant = value / 2.0**exp - 1.0
        table[byte] = ((exp + 10) << 3) | round(mant * 8)
    return table


def check_block_scales(scale: torch.Tensor) -> None:
    """ValueError on a NaN e4m3 block scale. A negative one counts as its magnitude: the W4A16 decode has
    always dropped the sign bit (checkpoints have none; SGLang's ``--load-format dummy`` fills scales with
    small values of either sign)."""
    byte = scale.view(torch.uint8)
    bad = (byte & 0x7F) == 0x7F
    if bool(bad.any()):
        first = int(byte[bad].flatten()[0])
        raise ValueError(f"block scales must not be NaN; found e4m3 byte {first:#04x}")


def scale_codes(scale: torch.Tensor) -> torch.Tensor:
    """e4m3 block scales -> uint8 kernel-layout codes of their magnitudes (same shape); ValueError on NaN."""
    if scale.dtype != torch.float8_e4m3fn:
        raise TypeError(f"scale_codes: expected float8_e4m3fn, got {scale.dtype}")
    check_block_scales(scale)
    byte = scale.view(torch.uint8)
    table = _scale_code_table().to(byte.device)
    return table[(byte & 0x7F).long()]


@functools.cache
def _scale_byte_table() -> torch.Tensor:
    """[256] uint8: the e4m3 byte of each scale code (the inverse of ``_scale_code_table``; 0 for unused codes)."""
    inverse = torch.zeros(256, dtype=torch.uint8)
    table = _scale_code_table()  # memoized: read, never written
    for byte in range(127):
        inverse[int(table[byte])] = byte
    inverse[0] = 0
    return inverse


def scales_from_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 kernel-layout codes -> e4m3 block scales (the inverse of ``scale_codes``)."""
    return _scale_byte_table().to(codes.device)[codes.long()].view(torch.float8_e4m3fn)


@functools.cache
def _word_table(src: int, dst: int) -> torch.Tensor:
    """[65536] int16: word (as uint16) in layout ``src`` -> the same codes in layout ``dst``."""
    words = torch.arange(65536, dtype=torch.int32)
    out = torch.zeros_like(words)
    for q in range(4):
        for role in range(4):
            out |= ((words >> WORD_BITS[src][q][role]) & 1) << WORD_BITS[dst][q][role]
    return out.to(torch.int16)  # wraps to the same 16 bits


def _remap_words(packed: torch.Tensor, src: int, dst: int, zero_blocks: torch.Tensor | None) -> torch.Tensor:
    words = packed.view(torch.int16)
    if zero_blocks is not None:  # [..., K/16] -> the 4 words of each block
        words = words.masked_fill(zero_blocks.repeat_interleave(BLOCK_SIZE // 4, dim=-1), 0)
    table = _word_table(src, dst).to(words.device)
    return table[words.long() & 0xFFFF].view(torch.uint8)


def _wgmma_word_order(words: torch.Tensor, inverse: bool) -> torch.Tensor:
    """[..., K/4] int16 words: natural order -> "kernel_wgmma" slots (slot 8h + 2b + i <- word 4b + 2h + i),
    or back with ``inverse``."""
    lead, n = words.shape[:-1], words.shape[-1]
    if n % WGMMA_GROUP_WORDS:
        raise ValueError(f"kernel_wgmma layout: K must be a multiple of {4 * WGMMA_GROUP_WORDS}, got {4 * n}")
    if inverse:  # [.., h, b, i] -> [.., b, h, i]
        grouped = words.reshape(*lead, n // WGMMA_GROUP_WORDS, 2, 4, 2)
    else:  # [.., b, h, i] -> [.., h, b, i]
        grouped = words.reshape(*lead, n // WGMMA_GROUP_WORDS, 4, 2, 2)
    return grouped.transpose(-3, -2).reshape(*lead, n)


def _check_kernel_layout(layout: str) -> None:
    if layout not in LAYOUTS[1:]:
        raise ValueError(f"layout: expected one of {LAYOUTS[1:]}, got {layout!r}")


def to_kernel_layout(
    packed: torch.Tensor, scale: torch.Tensor, layout: str = "kernel"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint ``packed`` [..., K/2] uint8 and ``scale`` [..., K/16] e4m3 -> ``layout``, "kernel" or
    "kernel_wgmma" (new tensors, same shapes and dtypes: the scale tensor holds codes, viewed as e4m3). Same
    values."""
    _check_kernel_layout(layout)
    codes = scale_codes(scale)
    words = _remap_words(packed, 0, 1, codes == 0)
    if layout == "kernel_wgmma":
        words = _wgmma_word_order(words.view(torch.int16), inverse=False).contiguous().view(torch.uint8)
    return words, codes.view(torch.float8_e4m3fn)


def from_kernel_layout(
    packed: torch.Tensor, scale: torch.Tensor, layout: str = "kernel"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``to_kernel_layout`` (exact but for the codes of zero-scale blocks, which are 0)."""
    _check_kernel_layout(layout)
    if layout == "kernel_wgmma":
        packed = _wgmma_word_order(packed.view(torch.int16), inverse=True).contiguous().view(torch.uint8)
    return _remap_words(packed, 1, 0, None), scales_from_codes(scale.view(torch.uint8))


def activation_period(layout: str) -> int:
    """The period, in K columns, of the activation K order the W4A16 kernels read for weights in ``layout``."""
    return 4 * WGMMA_GROUP_WORDS if layout == "kernel_wgmma" else 32
