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
