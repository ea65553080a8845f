"""The W4A16 kernels' weight layouts (``nvfp4.to_kernel_layout``): the same values, a cheaper decode.

The kernel layout moves bits within each 16-bit word of codes and re-encodes block scales; kernel_wgmma also
reorders the words of each group of 16. Every weight keeps its value, so the op must give bit-identical
results in the checkpoint and kernel layouts (the decode is exact in both; kernel_wgmma sums K in another
order), and every conversion must round-trip.
"""

from __future__ import annotations

import pytest
import torch

from sglang_glm5 import nvfp4
from sglang_glm5.moe import fused_moe
from sglang_glm5.prefill import dequantize_bf16
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.weights import Nvfp4MoeWeights

E4M3_BYTES = torch.arange(0x7F, dtype=torch.uint8)  # every non-negative, non-NaN e4m3 value


def _bundle(layer, **kwargs) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights.build(*layer.args(), **kwargs)


def test_word_layouts_place_every_bit_once():
    for layout in nvfp4.WORD_BITS:
        assert sorted(bit for code in layout for bit in code) == list(range(16))


def test_scale_codes_keep_every_e4m3_value_and_the_kernels_formulas_hold():
    scale = E4M3_BYTES.view(torch.float8_e4m3fn)
    codes = nvfp4.scale_codes(scale)
    assert torch.equal(nvfp4.scales_from_codes(codes).view(torch.uint8), E4M3_BYTES)  # a bijection on values
    value = scale.double()
    nonzero = value > 0
    assert bool((codes[~nonzero] == 0).all()) and bool((codes[nonzero] >= 8).all())
    # what the kernels compute from a code: code * 16 + 0x7600 as bf16 (decode into bf16) and code * 128 +
    # 0x3000 as fp16 (decode into fp16; the interpreter and the dense prefill dequant)
    c = codes[nonzero].to(torch.int32)
    bf16 = (c * 16 + 0x7600).to(torch.int16).view(torch.bfloat16).double()
    fp16 = (c * 128 + 0x3000).to(torch.int16).view(torch.float16).double()
    assert torch.equal(bf16, value[nonzero] * 2.0**119)
    assert torch.equal(fp16, value[nonzero] * 2.0**7)


KERNEL_LAYOUTS = nvfp4.LAYOUTS[1:]


# odd rows, one block, no rows, two groups of 64 (kernel_wgmma reorders words within each)
@pytest.mark.parametrize("shape", [(3, 5, 64), (1, 7, 16), (2, 0, 32), (2, 3, 128)])
@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_kernel_layouts_round_trip(shape, layout, gen):
    if 0 in shape:  # (quantize has no rows to take an amax of)
        packed = torch.zeros(*shape[:-1], shape[-1] // 2, dtype=torch.uint8)
        scale = torch.zeros(*shape[:-1], shape[-1] // 16).to(torch.float8_e4m3fn)
        q = nvfp4.NvFp4Tensor(packed, scale, torch.tensor(1.0))
    else:
        q = nvfp4.quantize(torch.randn(*shape, generator=gen))
    if layout == "kernel_wgmma" and shape[-1] % 64:
        with pytest.raises(ValueError, match="K must be a multiple of 64"):
            nvfp4.to_kernel_layout(q.packed, q.scale, layout)
        return
    packed, scale = nvfp4.to_kernel_layout(q.packed, q.scale, layout)
    assert packed.shape == q.packed.shape and packed.dtype == torch.uint8 and scale.dtype == torch.float8_e4m3fn
    back_packed, back_scale = nvfp4.from_kernel_layout(packed, scale, layout)
    assert torch.equal(back_packed, q.packed) and torch.equal(back_scale.view(torch.uint8), q.scale.view(torch.uint8))


def test_the_wgmma_layout_puts_each_blocks_words_where_one_thread_reads_them():
    """kernel_wgmma: slots 2b, 2b + 1, 2b + 8, 2b + 9 of every 16 (one thread's words in a wgmma register
    operand) hold block b's four words, in order; the kernel layout's bits within each word stay as they are."""
    words = torch.arange(64, dtype=torch.int16).reshape(1, 64)  # word w -> value w: where each one goes
    slots = nvfp4._wgmma_word_order(words, inverse=False)[0].tolist()
    for group in range(4):
        for b in range(4):
            want = [16 * group + 4 * b + j for j in range(4)]
            got = [slots[16 * group + s] for s in (2 * b, 2 * b + 1, 2 * b + 8, 2 * b + 9)]
            assert got == want, (group, b)
    q = nvfp4.quantize(torch.randn(2, 128))
    plain, _ = nvfp4.to_kernel_layout(q.packed, q.scale, "kernel")
    paired, _ = nvfp4.to_kernel_layout(q.packed, q.scale, "kernel_wgmma")
    assert torch.equal(nvfp4._wgmma_word_order(plain.view(torch.int16), inverse=False), paired.view(torch.int16))


@pytest.mark.parametrize("arch,hidden,inter,want", [
    (90, 6144, 2048, "kernel_wgmma"),  # GLM-5 EP8 on Hopper
    (90, 6144, 256, "kernel_wgmma"),  # GLM-5 TP8
    (90, 96, 64, "kernel"),  # H not a multiple of 64
    (90, 128, 32, "kernel"),  # I not a multiple of 64
    (120, 6144, 2048, "kernel"),  # SM120: mma.sync, a thread's words are adjacent already
    (80, 6144, 2048, "kernel"),
])  # fmt: skip
def test_kernel_layout_by_arch_and_shape(arch, hidden, inter, want):
    from sglang_glm5.weights import kernel_layout

    assert kernel_layout(arch, hidden, inter) == want


def test_zero_scale_blocks_decode_to_zero_whatever_their_codes(gen):
    q = nvfp4.quantize(torch.randn(4, 64, generator=gen))
    scale = q.scale.clone()
    scale.view(torch.uint8)[1, 2] = 0  # codes of that block stay nonzero: its values are 0 all the same
    packed, codes = nvfp4.to_kernel_layout(q.packed, scale)
    back_packed, back_scale = nvfp4.from_kernel_layout(packed, codes)
    assert torch.equal(nvfp4.dequantize(back_packed, back_scale, 1.0), nvfp4.dequantize(q.packed, scale, 1.0))
    assert bool((nvfp4.unpack(back_packed)[1, 32:48] == 0).all())


@pytest.mark.parametrize("bad", [0x7F, 0xFF])  # NaN, negative NaN
def test_nan_block_scales_are_refused_before_anything_changes(bad, gen):
    layer = random_layer(2, 64, 32, gen)
    layer.w2_scale.view(torch.uint8)[1, 3, 0] = bad
    before = layer.w13.clone()
    with pytest.raises(ValueError, match="block scales must not be NaN"):
        _bundle(layer).converted("kernel", in_place=True)
    assert torch.equal(layer.w13, before)  # w13 comes first: an in-place conversion is all or nothing


def test_a_negative_block_scale_counts_as_its_magnitude(gen):
    """As the W4A16 decode always read it (SGLang's --load-format dummy fills scales of either sign)."""
    q = nvfp4.quantize(torch.randn(3, 64, generator=gen))
    negative = q.scale.clone()
    negative.view(torch.uint8)[1, 2] |= 0x80
    codes = nvfp4.scale_codes(negative)
    assert torch.equal(codes, nvfp4.scale_codes(q.scale))


def _cfg(bm, bn, bk):
    c = GemmConfig(block_m=bm, block_n=bn, block_k=bk)
    return MoeConfig(c, c)


# (tokens, experts, hidden, inter, top_k, dtype, config, remote fraction), each with why
OP_CASES = [
    (1, 8, 256, 128, 2, torch.bfloat16, None, 0.0),  # one decode token: split K on both GEMMs
    (17, 8, 256, 128, 8, torch.bfloat16, None, 0.4),  # expert parallelism: -1 slots dropped
    (9, 8, 256, 128, 3, torch.float16, None, 0.0),  # fp16 activations: the fp16 decode of the kernel layout
    (11, 5, 96, 160, 3, torch.bfloat16, None, 0.0),  # K not a multiple of block_k: masked codes and scales
    (13, 8, 160, 128, 3, torch.bfloat16, _cfg(16, 32, 64), 0.0),  # gemm2 walking several N tiles
    (40, 8, 256, 128, 4, torch.bfloat16, _cfg(32, 32, 64), 0.0),  # several blocks and N tiles
    (7, 5, 192, 128, 3, torch.bfloat16, _cfg(16, 64, 128), 0.0),  # kernel_wgmma with H not a multiple of block_k
]


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: f"T{c[0]}-E{c[1]}-H{c[2]}-I{c[3]}-k{c[4]}-{c[5]}")
def test_op_gives_the_same_results_in_every_layout(case, gen, device):
    """Bit-identical in the kernel layout (the same K order); in kernel_wgmma (H, I multiples of 64) the K order
    differs, so the fp32 sums may round apart: within 1e-3 of the checkpoint layout's output (the bf16 output
    rounds at 4e-3)."""
    tokens, experts, hidden, inter, top_k, dtype, config, remote = case
    layer = random_layer(experts, hidden, inter, gen)
    layer.w13_scale.view(torch.uint8)[0, 1, 0] = 2  # an e4m3 subnormal scale
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    weights, ids = random_routing(tokens, experts, top_k, gen, remote_fraction=remote)
    ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    checkpoint = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args()))
    kernel = checkpoint.converted("kernel")
    assert kernel.layout == "kernel" and checkpoint.layout == "checkpoint"
    args = (x.to(device), weights.to(device), ids.to(device))
    out_checkpoint = fused_moe(args[0], checkpoint, *args[1:], config=config, path="w4a16")
    out_kernel = fused_moe(args[0], kernel, *args[1:], config=config, path="w4a16")
    assert torch.equal(out_kernel, out_checkpoint)
    rel = ((out_kernel.cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert rel < 1e-2, f"relative error {rel:.2e} against the float64 reference"
    if hidden % 64 or inter % 64:
        with pytest.raises(ValueError, match="multiples of 64"):
            checkpoint.converted("kernel_wgmma")
        return
    wgmma = kernel.converted("kernel_wgmma")
    out_wgmma = fused_moe(args[0], wgmma, *args[1:], config=config, path="w4a16")
    apart = ((out_wgmma.float() - out_checkpoint.float()).norm() / out_checkpoint.float().norm()).item()
    assert apart < 1e-3, f"kernel_wgmma against the checkpoint layout: {apart:.2e}"
    rel = ((out_wgmma.cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert rel < 1e-2, f"kernel_wgmma: relative error {rel:.2e} against the float64 reference"


def test_in_place_conversion_keeps_the_tensors_and_the_values(gen, device):
    layer = random_layer(4, 128, 64, gen)
    tensors = [t.to(device, copy=True) for t in layer.args()]
    bundle = Nvfp4MoeWeights.build(*tensors)
    x = torch.randn(6, 128, generator=gen).bfloat16().to(device)
    weights, ids = (t.to(device) for t in random_routing(6, 4, 2, gen))
    before = fused_moe(x, bundle, weights, ids, path="w4a16")
    converted = bundle.converted("kernel", in_place=True)
    assert converted.w13 is tensors[0] and converted.w2_scale is tensors[4]  # no second copy of the layer
    assert not torch.equal(tensors[0], layer.w13.to(device))  # the storage itself was re-encoded
    assert torch.equal(fused_moe(x, converted, weights, ids, path="w4a16"), before)
    again = converted.converted("checkpoint", in_place=True)
    assert torch.equal(again.w13.cpu(), layer.w13) and torch.equal(again.w2.cpu(), layer.w2)


def test_in_place_conversions_between_kernel_layouts_keep_the_tensors_and_the_values(gen, device):
    """checkpoint -> kernel_wgmma -> kernel -> kernel_wgmma -> checkpoint in the same storage (the plugin's restore
    hook takes a layer back to the checkpoint's layout): the same bytes as direct conversions at every step."""
    layer = random_layer(3, 128, 64, gen)
    tensors = [t.to(device, copy=True) for t in layer.args()]
    bundle = Nvfp4MoeWeights.build(*tensors)
    fresh = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args()))
    direct = {lay: fresh.converted(lay) for lay in KERNEL_LAYOUTS}
    for lay in ("kernel_wgmma", "kernel", "kernel_wgmma"):
        bundle = bundle.converted(lay, in_place=True)
        assert bundle.layout == lay and bundle.w13 is tensors[0] and bundle.w2_scale is tensors[4]
        for got, want in ((bundle.w13, direct[lay].w13), (bundle.w2, direct[lay].w2),
                          (bundle.w13_scale, direct[lay].w13_scale)):  # fmt: skip
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), lay
    back = bundle.converted("checkpoint", in_place=True)
    assert torch.equal(back.w13.cpu(), layer.w13) and torch.equal(back.w2.cpu(), layer.w2)
    assert torch.equal(back.w13_scale.cpu().view(torch.uint8), layer.w13_scale.view(torch.uint8))


@pytest.mark.parametrize("hidden,inter", [(96, 64), (128, 96)])
def test_a_bundle_refuses_kernel_wgmma_for_a_shape_it_cannot_take(hidden, inter, gen):
    layer = random_layer(2, hidden, inter, gen)
    with pytest.raises(ValueError, match="H and I must be multiples of 64"):
        _bundle(layer, layout="kernel_wgmma")
    with pytest.raises(ValueError, match="H and I must be multiples of 64"):
        _bundle(layer).converted("kernel_wgmma", in_place=True)
    assert torch.equal(_bundle(layer).w13, layer.w13)  # nothing was converted


@pytest.mark.parametrize("layout,hidden", [("kernel", 96), ("kernel_wgmma", 192)])  # K: 3 groups of 32 / of 64
def test_dense_prefill_dequantizes_every_layout_alike(layout, hidden, gen, device):
    layer = random_layer(3, hidden, 64, gen)
    packed, scale = (t.to(device) for t in (layer.w13, layer.w13_scale))
    kernel_packed, kernel_scale = nvfp4.to_kernel_layout(packed, scale, layout)
    want = dequantize_bf16(packed, scale)
    assert torch.equal(dequantize_bf16(kernel_packed, kernel_scale, layout=layout), want)
    exact = nvfp4.dequantize(layer.w13, layer.w13_scale, 1.0)
    assert torch.equal(want.cpu().float(), exact)


def test_w4a4_refuses_the_kernel_layout(gen):
    from sglang_glm5.w4a4 import run_w4a4

    layer = random_layer(2, 64, 32, gen)
    bundle = _bundle(layer, w13_input_scale=1.0, w2_input_scale=1.0).converted("kernel")
    x = torch.randn(2, 64, generator=gen).bfloat16()
    weights, ids = random_routing(2, 2, 1, gen)
    with pytest.raises(RuntimeError, match="checkpoint's codes and block scales"):
        run_w4a4(x, bundle, weights, ids, out=torch.empty_like(x))


def test_the_plugins_bundle_keeps_the_checkpoint_layout_only_off_a_gpu_or_for_w4a4(gen, device):
    from sglang_glm5.hardware import device_arch

    bundle = Nvfp4MoeWeights.build(*(t.to(device) for t in random_layer(2, 64, 32, gen).args()))
    assert bundle.for_device(w4a4=True) is bundle  # the W4A4 kernels read the checkpoint's codes and scales
    want = "kernel" if device.type == "cuda" else "checkpoint"  # the interpreter: nothing to gain
    assert bundle.for_device().layout == want  # I = 32: not kernel_wgmma even on Hopper
    wide = Nvfp4MoeWeights.build(*(t.to(device) for t in random_layer(2, 128, 64, gen).args()))
    if device.type == "cuda":
        want = "kernel_wgmma" if device_arch(device) == 90 else "kernel"
    assert wide.for_device().layout == want
    with pytest.raises(ValueError, match="layout: expected one of"):
        bundle.converted("swizzled")


def _run_decode_ptx(ptx: str, words: torch.Tensor, scale_input: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Execute ``decode_ptx``'s PTX on int64 tensors holding 32-bit registers (the instructions it emits:
    mov, mad.lo, shl, shr, and, lop3 0xF8, and the packed fma by (-0, -0)); -> [n, 2] float64 lane values."""
    regs = {"$1": words, "$2": scale_input}
    mask32 = 0xFFFFFFFF
    dtype = torch.bfloat16 if bf16 else torch.float16

    def val(name: str) -> torch.Tensor:
        return regs[name] if name in regs else torch.full_like(words, int(name, 0))

    def as_float(r: torch.Tensor) -> torch.Tensor:  # [n, 2] lane values of 32-bit registers
        pair = torch.stack((r & 0xFFFF, r >> 16), dim=-1).to(torch.int32).to(torch.int16)
        return pair.view(dtype).double()

    lanes = None
    for line in ptx.replace("{", "").replace("}", "").split("\n"):
        line = line.strip().rstrip(";")
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == "mov.b32":
            regs[a[0]] = val(a[1])
        elif op == "mad.lo.u32":
            regs[a[0]] = (val(a[1]) * int(a[2], 0) + int(a[3], 0)) & mask32
        elif op == "shl.b32":
            regs[a[0]] = (val(a[1]) << int(a[2])) & mask32
        elif op == "shr.b32":
            regs[a[0]] = val(a[1]) >> int(a[2])
        elif op == "and.b32":
            regs[a[0]] = val(a[1]) & val(a[2])
        elif op == "lop3.b32":
            assert a[4] == "0xF8", line  # a | (b & c)
            regs[a[0]] = val(a[1]) | (val(a[2]) & val(a[3]))
        elif op.startswith("fma.rn."):
            lanes = as_float(val(a[1])) * as_float(val(a[2]))  # + (-0): exact products, no rounding
        else:
            raise AssertionError(f"an instruction the emulator does not know: {line}")
    return lanes


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", [0, 1], ids=nvfp4.LAYOUTS[:2])  # kernel_wgmma decodes as kernel
def test_decode_ptx_gives_every_code_times_its_scale(layout, bf16):
    """The PTX the kernels inline, run instruction by instruction on every 16-bit word of codes, with scales
    from the smallest to the largest: code q of each word, times the scale, times 2^-7 (exact)."""
    from sglang_glm5.kernels import nvfp4_decode

    words = torch.arange(65536, dtype=torch.int64)
    # lane 0: every word; lane 1: the words in another order (both lanes share the register's scale)
    reg = words | (torch.flip(words, (0,)) << 16)
    codes_cp = torch.stack([(words >> (4 * q)) & 0xF for q in range(4)], -1)  # the checkpoint's codes
    if layout == 1:  # the same codes re-encoded: positions per nvfp4.KERNEL_WORD
        kernel = torch.zeros_like(words)
        for q in range(4):
            for role in range(4):
                kernel |= ((codes_cp[:, q] >> role) & 1) << nvfp4.KERNEL_WORD[q][role]
        reg = kernel | (torch.flip(kernel, (0,)) << 16)
    for byte in (0x01, 0x08, 0x38, 0x55, 0x7E):  # e4m3 subnormal, smallest normal, 1.0, 3.25, 448
        scale = float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).double())
        if layout == 1:
            scale_in = torch.full_like(words, int(nvfp4.scale_codes(torch.tensor([byte], dtype=torch.uint8).view(
                torch.float8_e4m3fn))[0]))  # fmt: skip
        else:  # what decode_nvfp4 hands the asm: scale * 2^119 as bf16, or scale * 2^7 as fp16, in both lanes
            value = scale * (2.0**119 if bf16 else 2.0**7)
            bits = int(torch.tensor([value], dtype=torch.bfloat16 if bf16 else torch.float16).view(torch.int16)[0])
            bits &= 0xFFFF
            scale_in = torch.full_like(words, bits | (bits << 16))
        for q in range(4):
            got = _run_decode_ptx(nvfp4_decode.decode_ptx(bf16, q, layout), reg, scale_in, bf16)
            want0 = nvfp4.e2m1_codes_to_float(codes_cp[:, q].to(torch.uint8), torch.float64) * scale * 2.0**-7
            want1 = torch.flip(want0, (0,))
            assert torch.equal(got[:, 0], want0) and torch.equal(got[:, 1], want1), (layout, bf16, byte, q)
