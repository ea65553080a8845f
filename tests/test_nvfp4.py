"""The NVFP4 format library: rounding, packing, dequantization, scale layouts."""

import pytest
import torch

from sglang_glm5 import nvfp4


def test_e2m1_round_to_nearest_even_and_saturate():
    # Midpoints between grid values go to the neighbour with the even code (mantissa bit 0).
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, 0.2, 0.3, 2.9, -0.25, -0.3, -5.1])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 0.0, 0.5, 3.0, 0.0, -0.5, -6.0])
    codes = nvfp4.float_to_e2m1_codes(x)
    assert torch.equal(nvfp4.e2m1_codes_to_float(codes), want)
    assert codes[12] == 0, "-0.25 rounds to +0, never to the negative-zero code 8"


def test_codes_round_trip_every_value():
    codes = torch.arange(16, dtype=torch.uint8)
    values = nvfp4.e2m1_codes_to_float(codes)
    back = nvfp4.float_to_e2m1_codes(values)
    assert torch.equal(back[values != 0], codes[values != 0])


def test_pack_low_nibble_is_even_element(gen):
    codes = torch.randint(0, 16, (3, 5, 32), generator=gen, dtype=torch.uint8)
    packed = nvfp4.pack(codes)
    assert packed.shape == (3, 5, 16)
    assert torch.equal(packed[..., 0] & 0xF, codes[..., 0])
    assert torch.equal(packed[..., 0] >> 4, codes[..., 1])
    assert torch.equal(nvfp4.unpack(packed), codes)


@pytest.mark.parametrize("shape", [(1, 16), (7, 48), (3, 5, 256), (130, 64)])
def test_quantize_error_within_half_grid_step(shape, gen):
    x = torch.randn(shape, generator=gen) * torch.rand(shape[:-1] + (1,), generator=gen) * 10
    q = nvfp4.quantize(x)
    deq = q.dequantize(torch.float64)
    # Largest e2m1 gap is 2 (between 4 and 6), so nearest rounding errs by at most one scale unit;
    # a block amax that rounds down to e4m3 saturates at 6 with an error under 0.375 of a unit.
    unit = q.scale.double().repeat_interleave(16, dim=-1) * q.global_scale.double()
    assert torch.all((deq - x.double()).abs() <= unit * (1 + 1e-6))
    rel = (deq - x.double()).norm() / x.double().norm()
    assert rel < 0.15, f"NVFP4 relative error {rel:.3f} is far above the ~0.1 expected for Gaussian data"


def test_quantize_of_representable_values_is_exact(gen):
    # Each block holds a +-6 so its scale is exactly representable: re-quantizing gives the same bits.
    codes = torch.randint(0, 16, (9, 64), generator=gen, dtype=torch.uint8)
    codes[:, ::16] = 7
    codes[codes == 8] = 0  # negative zero re-quantizes to +0
    scale = (torch.rand(9, 4, generator=gen) * 400 + 0.1).to(torch.float8_e4m3fn)
    gs = torch.tensor(0.0123)
    x = nvfp4.dequantize(nvfp4.pack(codes), scale, gs)
    q = nvfp4.quantize(x, gs)
    assert torch.equal(q.packed, nvfp4.pack(codes))
    assert torch.equal(q.scale.view(torch.uint8), scale.view(torch.uint8))


def test_quantize_all_zero_blocks():
    q = nvfp4.quantize(torch.zeros(2, 32))
    assert torch.equal(q.dequantize(), torch.zeros(2, 32))


@pytest.mark.parametrize("rows,cols", [(1, 1), (127, 3), (128, 4), (129, 7), (300, 384)])
@pytest.mark.parametrize("batch", [None, 3])
def test_swizzle_unswizzle_identity(rows, cols, batch, gen):
    shape = (rows, cols) if batch is None else (batch, rows, cols)
    s = torch.randint(0, 127, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sw = nvfp4.swizzle_scales(s)
    assert sw.shape[-2] % 128 == 0 and sw.shape[-1] % 4 == 0
    back = nvfp4.unswizzle_scales(sw, rows, cols)
    assert torch.equal(back.view(torch.uint8), s.view(torch.uint8))
    # Padding is zero: the swizzle adds exactly (padded - real) zero bytes.
    pad = sw.numel() - s.numel()
    assert int((sw.view(torch.uint8) == 0).sum()) - int((s.view(torch.uint8) == 0).sum()) == pad


def test_swizzle_places_row_32_next_to_row_0():
    # Inside a 128 x 4 tile the layout is [32 rows][4 row groups][4 columns]: row 32 col 0 is byte 4.
    s = torch.zeros(128, 4, dtype=torch.uint8)
    s[32, 0] = 1
    s[1, 0] = 2
    flat = nvfp4.swizzle_scales(s.view(torch.float8_e4m3fn)).view(torch.uint8).reshape(-1)
    assert flat[4] == 1 and flat[16] == 2


def test_unswizzle_rejects_wrong_size():
    with pytest.raises(ValueError, match="cannot hold"):
        nvfp4.unswizzle_scales(torch.zeros(100, 4, dtype=torch.float8_e4m3fn), 128, 4)


def test_dequantize_rejects_mismatched_scale():
    with pytest.raises(ValueError, match="scale shape"):
        nvfp4.dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.float8_e4m3fn), 1.0)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        nvfp4.dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2), 1.0)


# --- Agreement with SGLang's own references (when SGLang is installed) -------------------------


def test_matches_sglang_reference_dequantize(gen):
    ref = pytest.importorskip("sglang.test.quant_ref_utils")
    rows, k = 200, 96
    x = torch.randn(rows, k, generator=gen) * 3
    q = nvfp4.quantize(x)
    assert torch.equal(ref.break_fp4_bytes(q.packed), nvfp4.e2m1_codes_to_float(nvfp4.unpack(q.packed)))
    swizzled = nvfp4.swizzle_scales(q.scale)
    lin = ref.convert_swizzled_to_linear(swizzled, rows, k)
    assert torch.equal(lin.view(torch.uint8), q.scale.view(torch.uint8))
    # SGLang's helper divides by the reciprocal global scale (448 * 6 / amax).
    theirs = ref.dequantize_nvfp4_to_dtype(q.packed, swizzled, 1.0 / q.global_scale, torch.float32)
    ours = q.dequantize(torch.float32)
    torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=0)


def test_matches_sglang_swizzle_blockscale(gen):
    utils = pytest.importorskip("sglang.srt.layers.quantization.utils")
    for shape in [(3, 129, 7), (2, 256, 8), (1, 64, 384)]:
        s = torch.randint(0, 127, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
        theirs = utils.swizzle_blockscale(s)
        assert torch.equal(theirs.view(torch.uint8), nvfp4.swizzle_scales(s).view(torch.uint8)), shape
