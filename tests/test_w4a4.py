"""W4A4 path: CPU emulation against the float64 reference, the kernels' logic through the
interpreter (dot_scaled swapped for a decoded fp32 dot), and the sm_120 AOT compile of every shipped config.

Nothing here runs on SM120 hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from sglang_glm5 import nvfp4, w4a4
from sglang_glm5.hardware import TARGETS
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a4 as family
from sglang_glm5.w4a4_verify import activation_error_bound, calibrated_input_scales, reference_intermediates

NVFP4_MMA = "kind::mxf4nvf4.block_scale.scale_vec::4X"  # e2m1 x e2m1, one ue4m3 scale per 16


@dataclass(frozen=True)
class Case:
    num_tokens: int
    num_experts: int = 8
    hidden: int = 256
    inter: int = 128
    top_k: int = 4
    remote_fraction: float = 0.0
    w13_order: str = "gate_up"
    per_expert_w2_scale: bool = True


CASES = [
    Case(64),  # prefill-like: several tokens per expert
    Case(17, top_k=8, remote_fraction=0.3),  # odd T, expert parallelism (-1 ids)
    Case(9, num_experts=5, hidden=96, inter=160, top_k=3, w13_order="up_gate"),  # odd sizes, [up; gate] rows
    Case(12, per_expert_w2_scale=False),  # one scalar w2 input scale (flashinfer_cutlass style)
]


def _rel(err: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(RMS relative error, max error / max |ref|)."""
    return float(err.norm() / ref.norm()), float(err.abs().max() / ref.abs().max())


def _problem(case: Case, gen: torch.Generator):
    layer = random_layer(case.num_experts, case.hidden, case.inter, gen)
    x = torch.randn(case.num_tokens, case.hidden, generator=gen).to(torch.bfloat16)
    weights, ids = random_routing(case.num_tokens, case.num_experts, case.top_k, gen,
                                  remote_fraction=case.remote_fraction)  # fmt: skip
    args = list(layer.args())
    if case.w13_order == "up_gate":
        i = case.inter
        args[0] = torch.cat([args[0][:, i:], args[0][:, :i]], dim=1).contiguous()
        args[1] = torch.cat([args[1][:, i:], args[1][:, :i]], dim=1).contiguous()
    # Calibrated input scales, ModelOpt's way: amax / (448 * 6), from this batch (the checkpoint's come
    # from calibration data; the intermediate's amax from the float64 reference's h).
    h = reference_intermediates(x, *args[:3], ids, case.w13_order)  # float64, per expert
    a1, a2 = calibrated_input_scales(x, h)
    if not case.per_expert_w2_scale:
        a2 = a2.max()
    return x, args, weights, ids, a1, a2, h


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c.num_tokens}-E{c.num_experts}-H{c.hidden}-I{c.inter}")
def test_emulation_within_the_nvfp4_activation_bound(case, gen):
    x, args, weights, ids, a1, a2, h = _problem(case, gen)
    ref = nvfp4_fused_moe_reference(x, *args, weights, ids, w13_order=case.w13_order)
    got = w4a4.nvfp4_fused_moe_w4a4_emulated(x, *args, weights, ids, a1, a2, w13_order=case.w13_order)
    assert got.dtype == x.dtype and got.shape == x.shape
    if not (ids >= 0).any():
        assert not got.any()
        return
    # The bound NVFP4 activations imply (derivation: w4a4_verify.activation_error_bound, which the
    # self-check on an SM12x GPU uses too), from eps_x measured on this x and eps_h on the reference's h.
    eb = activation_error_bound(x, a1, h, a2)
    eps_x, eps_h, bound = eb.eps_x, eb.eps_h, eb.bound
    rms, worst = _rel(got.double() - ref, ref)
    print(f"eps_x {eps_x:.4f} eps_h {eps_h:.4f} bound {bound:.4f} | rms {rms:.4f} max/max {worst:.4f}")
    assert 0.03 < eps_x < 0.2, "NVFP4 of Gaussian data should lose ~10% RMS: the measurement itself is off"
    assert rms <= bound, f"RMS relative error {rms:.4f} > bound {bound:.4f} (eps_x {eps_x:.4f}, eps_h {eps_h:.4f})"
    # The largest error against the largest output: a Gaussian tail of the RMS error, ~4 sigma of a few
    # thousand samples, relative to an output max ~3-4x its RMS: 4x the RMS bound is loose enough.
    assert worst <= 4 * bound, f"max error {worst:.4f} of max |ref| > {4 * bound:.4f}"


def test_emulated_activation_quantization_is_exact_on_representable_values(gen):
    """Values that are already NVFP4 (with that global scale) come back bit for bit."""
    q = nvfp4.quantize(torch.randn(8, 64, generator=gen), 0.01)
    v = q.dequantize()
    assert torch.equal(w4a4.quantize_dequantize(v, 0.01), v)


# The interpreter runs the Triton kernels with EMULATE_DOT: their quantizers, indexing and epilogues
# against the torch emulation. Only fp32 summation order and the bf16 rounding of y differ.
KERNEL_CASES = [
    (Case(20, top_k=4), MoeConfig(GemmConfig(16, 32, 64), GemmConfig(32, 64, 32))),  # several N and K tiles
    (Case(9, num_experts=5, hidden=96, inter=160, top_k=3, w13_order="up_gate", remote_fraction=0.3), None),
]


@pytest.mark.parametrize("case,config", KERNEL_CASES, ids=["tiles", "odd-sizes"])
def test_kernels_match_the_emulation_in_the_interpreter(case, config, gen):
    x, args, weights, ids, a1, a2, _ = _problem(case, gen)
    want = w4a4.nvfp4_fused_moe_w4a4_emulated(x, *args, weights, ids, a1, a2, w13_order=case.w13_order)
    got = w4a4.nvfp4_fused_moe_w4a4(
        x, *args, weights, ids, a1, a2, w13_order=case.w13_order, config=config, emulate_dot=True
    )
    rms, worst = _rel(got.double() - want.double(), want.double())
    print(f"kernels vs emulation: rms {rms:.2e}, max/max {worst:.2e}")
    # A requantized h code can flip at a rounding boundary when the fp32 sums differ in order: a few
    # elements of one NVFP4 step; everything else agrees to bf16 rounding.
    assert rms < 0.02 and worst < 0.1, f"kernels vs emulation: rms {rms:.4f}, max/max {worst:.4f}"


def test_tiles_are_picked_by_tokens_per_global_expert(monkeypatch, gen):
    """Under expert parallelism moe.nvfp4_fused_moe hands w4a4_select.resolve_path T * k / num_global_experts;
    the W4A4 op must pick its tiles on that same estimate, or auto would vouch for tiles other than those run."""
    from sglang_glm5 import autotune

    seen = []
    real = autotune.pick_config
    monkeypatch.setattr(autotune, "pick_config", lambda path, tpe, *a: seen.append(tpe) or real(path, tpe, *a))
    case = Case(16, top_k=4, remote_fraction=0.5)  # 64 pairs over 8 local experts of 32
    x, args, weights, ids, a1, a2, _ = _problem(case, gen)
    w4a4.nvfp4_fused_moe_w4a4(
        x, *args, weights, ids, a1, a2, w13_order="gate_up", config=None, emulate_dot=True, num_global_experts=32
    )
    w4a4.nvfp4_fused_moe_w4a4(x, *args, weights, ids, a1, a2, w13_order="gate_up", config=None, emulate_dot=True)
    assert seen == [2.0, 8.0]
    with pytest.raises(ValueError, match="num_global_experts: expected an int >= the 8 local experts, got 4"):
        w4a4.nvfp4_fused_moe_w4a4(
            x, *args, weights, ids, a1, a2, w13_order="gate_up", config=None, emulate_dot=True, num_global_experts=4
        )


def test_public_op_refuses_non_sm12x():
    with pytest.raises(RuntimeError, match="SM12x"):
        w4a4.nvfp4_fused_moe_w4a4(*([torch.zeros(1)] * 11))


def test_every_shipped_config_compiles_for_sm120_with_the_nvfp4_mma():
    """AOT for sm_120 (no GPU): fits 101376 B, and the PTX multiplies e2m1 x e2m1 with ue4m3 scales per 16.
    uint8 scales would silently compile to the mxfp4 form (ue8m0 per 32, scale_vec::2X): hence the full grep."""
    jobs = [(kernel, cfg, 120) for cfg in family.SHIPPED_CONFIGS for kernel in family.KERNELS]
    for (kernel, cfg, _), res in zip(jobs, family.aot_compile(jobs), strict=True):
        assert isinstance(res, family.AotResult), f"{kernel} {cfg.label}: {res}"
        print(f"sm_120 {kernel} {cfg.label}: {res.shared} B, {res.mma}")
        assert res.target.startswith(".target sm_120")
        assert TARGETS["rtx-pro-6000"].fits(res.shared), f"{kernel} {cfg.label}: {res.shared} B > 101376 B"
        assert res.mma and all(NVFP4_MMA in m and m.endswith(".ue4m3") for m in res.mma), res.mma


def test_sm90_compile_is_a_bf16_upcast():
    """Recorded behaviour of Triton 3.8 for sm_90: dot_scaled compiles, but into bf16 wgmma (no FP4 there)."""
    (res,) = family.aot_compile([("gemm2", family.SHIPPED_CONFIGS[0], 90)])
    assert isinstance(res, family.AotResult), res
    assert not any("mxf4" in m for m in res.mma) and any("bf16" in m for m in res.mma), res.mma


# Sampled: one AOT compile each (~1 s). The 4-stage 128x128x256 tile overflows sm_120 in gemm1 (149504 B).
MODEL_SAMPLE = [
    ("gemm1", GemmConfig(32, 64, 128, 4, 2)),
    ("gemm2", GemmConfig(64, 64, 128, 4, 3)),
    ("gemm1", GemmConfig(128, 64, 256, 4, 2)),
    ("gemm1", GemmConfig(64, 128, 128, 4, 4)),
    ("gemm2", GemmConfig(128, 128, 256, 8, 4)),
    ("gemm1", GemmConfig(128, 128, 256, 8, 4)),
]


def test_shared_memory_model_bounds_the_sm120_compile():
    """The tuner prunes by the model before compiling: it must never call a config smaller than it compiles."""
    compiled = family.compiled_shared_bytes_many(MODEL_SAMPLE, 120)
    for (kernel, cfg), shared in zip(MODEL_SAMPLE, compiled, strict=True):
        model = family.model_shared_bytes(kernel, cfg)
        print(f"{kernel} {cfg.label}: model {model} B, compiled {shared} B")
        assert isinstance(shared, int), f"{kernel} {cfg.label}: {shared}"
        assert shared <= model <= 1.25 * shared, f"{kernel} {cfg.label}: model {model} B vs compiled {shared} B"
    assert not TARGETS["rtx-pro-6000"].fits(compiled[-1]), "the sample should hold one tile that overflows sm_120"
