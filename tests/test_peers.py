"""The Marlin peer's conversion of NVFP4 weights, in plain torch; its output on a GPU where the library is built.

The scale encoding is compared with vLLM's own functions where its source tree is here (``.peers/vllm``, or the
folder in VLLM_SRC; ``bench/peers/build_marlin.py`` says where it comes from). The GPU test loads the library from
MARLIN_PEER_LIB (``bench/device_run.sh`` sets it) and skips without it.
"""

import ast
import math
import os
from pathlib import Path

import pytest
import torch

from sglang_glm5 import nvfp4, peers
from sglang_glm5.testing import random_layer

VLLM_SRC = Path(os.environ.get("VLLM_SRC", Path(__file__).resolve().parents[1] / ".peers/vllm"))


def random_scales(rows: int, groups: int, gen: torch.Generator, tiny: float = 0.1) -> torch.Tensor:
    """e4m3 block scales spread over the format's range, a fraction of them under 2^-6 (subnormal)."""
    exponents = torch.randint(-6, 9, (rows, groups), generator=gen).float()
    mantissa = 1 + torch.randint(0, 8, (rows, groups), generator=gen).float() / 8
    scales = (mantissa * exponents.exp2()).clamp(max=448)
    small = torch.rand(rows, groups, generator=gen) < tiny
    scales = torch.where(small, torch.randint(1, 8, (rows, groups), generator=gen).float() * 2.0**-9, scales)
    return scales.to(torch.float8_e4m3fn)


def test_marlin_scales_keep_every_block_scale_at_its_marlin_position(gen):
    scale = random_scales(128, 12, gen)  # N = 128 rows of a weight, K / 16 = 12 groups
    factor = peers.scale_factor(scale)
    encoded = peers.marlin_scales(scale, factor)
    assert encoded.shape == (12, 128) and encoded.dtype == torch.float8_e4m3fn
    # Every scale whose value x 2^7 x factor reaches 2 survives exactly; the rest are zeroed, as in vLLM.
    want = scale.float()
    want = torch.where(want * 2**7 * factor >= 2, want, torch.zeros_like(want))
    torch.testing.assert_close(peers.decode_marlin_scales(encoded, factor), want, rtol=0, atol=0)
    # Marlin's order along N: position 1 holds column 16 (64-column runs read 8 apart, then pairs swapped).
    plain = peers.decode_marlin_scales(encoded, factor).T  # [K/16, N] in the checkpoint's order
    bits = encoded.view(torch.uint8).to(torch.int16) << 7
    stored = bits.view(torch.half).float() / (2**7 * factor)
    torch.testing.assert_close(stored[:, 1], plain[:, 16], rtol=0, atol=0)
    torch.testing.assert_close(stored[:, 2], plain[:, 8], rtol=0, atol=0)


def test_scale_factor_lifts_small_scales_by_a_power_of_two(gen):
    scale = random_scales(64, 4, gen, tiny=0.0)
    top = float(scale.float().max())
    assert peers.scale_factor(scale) == 2.0 ** math.floor(math.log2(448 / top))
    shrunk = (scale.float() / 32).to(torch.float8_e4m3fn)  # exact: a power of two, no scale under 2^-6 x 2^-5 lost
    assert peers.scale_factor(shrunk) == 32 * peers.scale_factor(scale)
    assert peers.scale_factor(torch.zeros(64, 4).to(torch.float8_e4m3fn)) == 1.0


def test_global_scale_moves_into_bf16s_exponent_range():
    g = torch.rand(5) + 0.01
    torch.testing.assert_close(peers.marlin_global_scale(g, 4.0), g * 2.0**119 / 4)


@pytest.mark.parametrize(
    "tokens, experts, want",
    [(1, 32, 8), (256, 32, 16), (8192, 32, 64), (16, 256, 8), (256, 256, 16), (2048, 256, 64)],
)
def test_block_size_follows_vllms_rule(tokens, experts, want):
    # M_eff = ceil(M * E / 256) tokens a rank sees, M_eff * 8 / E slots per expert: the first block over 1/0.9 of it.
    assert peers.block_size_m(tokens, experts, 256, 8) == want


def test_tie_gate_up_gives_one_global_scale_and_nearly_the_same_weights(gen):
    layer = random_layer(3, 64, 32, gen)
    assert not torch.equal(layer.w13_scale_2[:, 0], layer.w13_scale_2[:, 1])  # random halves: apart
    tied = peers.tie_gate_up(layer)
    torch.testing.assert_close(tied.w13_scale_2[:, 0], tied.w13_scale_2[:, 1], rtol=0, atol=0)
    assert tied.w2 is layer.w2 and tied.w2_scale_2 is layer.w2_scale_2
    g = layer.w13_scale_2
    for e in range(3):
        before = torch.cat(
            [
                nvfp4.dequantize(layer.w13[e, :32], layer.w13_scale[e, :32], g[e, 0]),
                nvfp4.dequantize(layer.w13[e, 32:], layer.w13_scale[e, 32:], g[e, 1]),
            ]
        )
        after = nvfp4.dequantize(tied.w13[e], tied.w13_scale[e], tied.w13_scale_2[e, 0])
        rel = ((after - before).norm() / before.norm()).item()
        assert 0 < rel < 0.1, rel  # requantized: close, not equal
    again = peers.tie_gate_up(tied)
    assert torch.equal(again.w13, tied.w13) and torch.equal(again.w13_scale_2, tied.w13_scale_2)


def _vllm_functions(path: Path, names: set[str]) -> dict:
    """The named top-level functions of a vLLM source file, run in a namespace with torch (and a quiet logger)."""
    tree = ast.parse(path.read_text())
    body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    namespace = {"torch": torch, "logger": type("Quiet", (), {"warning_once": staticmethod(lambda *a, **k: None)})}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


@pytest.mark.skipif(not (VLLM_SRC / "vllm").is_dir(), reason=f"no vLLM source tree at {VLLM_SRC}")
def test_scale_encoding_matches_vllms_bytes(gen):
    utils = VLLM_SRC / "vllm/model_executor/layers/quantization/utils"
    ns = _vllm_functions(utils / "marlin_utils.py", {"get_scale_perms", "marlin_permute_scales"})
    ns.update(_vllm_functions(utils / "marlin_utils_fp4.py", {"_nvfp4_compute_scale_factor",
                                                              "nvfp4_marlin_process_scales"}))  # fmt: skip
    ns["nvfp4_marlin_process_scales"].__globals__.update(ns)
    ns["marlin_permute_scales"].__globals__.update(ns)
    scales = torch.stack([random_scales(128, 8, gen) for _ in range(3)])  # [E, N, K/16]
    factor = ns["_nvfp4_compute_scale_factor"](scales.to(torch.bfloat16), torch.bfloat16)
    assert factor == peers.scale_factor(scales)
    for e in range(3):
        s = ns["marlin_permute_scales"](s=scales[e].to(torch.bfloat16).T, size_k=8 * 16, size_n=128, group_size=16)
        theirs, _ = ns["nvfp4_marlin_process_scales"](s, scale_factor=factor, a_dtype=torch.bfloat16)
        assert torch.equal(peers.marlin_scales(scales[e], factor).view(torch.uint8), theirs.view(torch.uint8))


def test_fe2m1f_id_is_vllms_scalar_type_id():
    # exponent 2, mantissa 1, signed, bias 0, finite values only, no NaN: the fields of vllm/scalar_type.py's id.
    fields = [(2, 8), (1, 8), (1, 1), (0, 32), (1, 1), (0, 8)]
    value, offset = 0, 0
    for member, width in fields:
        value |= (member & ((1 << width) - 1)) << offset
        offset += width
    assert peers.FE2M1F_ID == value


MARLIN_LIB = os.environ.get("MARLIN_PEER_LIB")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Marlin runs on a CUDA GPU")
@pytest.mark.skipif(not MARLIN_LIB or not Path(MARLIN_LIB).is_file(), reason="MARLIN_PEER_LIB names no built library")
@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_marlin_matches_the_reference_with_other_ranks_slots(tokens, gen):
    from sglang_glm5.reference import nvfp4_fused_moe_reference
    from sglang_glm5.testing import random_routing

    peers.load_marlin(MARLIN_LIB)
    cuda = torch.Generator(device="cuda")
    cuda.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    layer = peers.tie_gate_up(random_layer(8, 256, 128, cuda, "cuda"))
    weights, ids = random_routing(tokens, 8, 4, cuda, remote_fraction=0.4, device="cuda")
    if not bool((ids >= 0).any()):  # every slot remote: nothing to compare
        ids[0, 0] = 0
    x = torch.randn(tokens, 256, generator=cuda, device="cuda").bfloat16()
    out = peers.marlin_moe(x, peers.convert(layer), weights, ids, num_global_experts=16)
    ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    assert torch.isfinite(out).all()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < 4e-2, rel


def test_a_row_with_marlin_shows_ours_over_marlin_and_its_range(tmp_path):
    from sglang_glm5 import bench_real

    row = bench_real.Row("ep8", 0.0, 16, 15.0, 11.8, 0.12, 0.2, 0.08, True, 3e-3, 3, [1.6, 1.7, 1.65], 0.15,
                         [0.78, 0.82, 0.8])  # fmt: skip
    line = bench_real.fmt(row)
    assert "| 0.1500 | 0.80 (0.78-0.82) | graph, 3 rounds in turn |" in line
    assert line.count("|") == bench_real.HEADER_MARLIN.split("\n")[0].count("|")
    numerics = [{"layout": "ep8", "tokens": 37, "local_slots": 40, "ours_rel_err": 2.2e-3, "marlin_rel_err": 4.7e-3,
                 "ok": True}]  # fmt: skip
    md = bench_real.write_results(tmp_path, "t", [row], {"gpu": "x"}, numerics).read_text()
    assert "| ep8 | 37 | 40 | 2.20e-03 | 4.70e-03 |" in md and bench_real.HEADER_MARLIN in md
    plain = bench_real.Row("ep8", 0.0, 16, 15.0, 11.8, 0.12, 0.2, 0.08, True, 3e-3)
    assert bench_real.fmt(plain).count("|") == bench_real.HEADER.split("\n")[0].count("|")


def test_silu_mul_is_silu_of_the_gate_half_times_the_up_half(gen, device):
    # 3 rows of I = 1100: a block of 1024 columns and a masked tail
    gate_up = (torch.randn(3, 2 * 1100, generator=gen) * 4).bfloat16().to(device)
    got = peers.silu_mul(gate_up).float().cpu()
    gate, up = gate_up.float().cpu().chunk(2, dim=1)
    torch.testing.assert_close(got, (torch.nn.functional.silu(gate) * up).bfloat16().float(), rtol=1e-2, atol=1e-2)
