"""Peers of the W4A16 op, called the way their own framework calls them, for the benchmark: vLLM's Marlin MoE.

Marlin (vLLM ``fused_moe/experts/marlin_moe.py``) runs NVFP4 weights with bf16 activations on any GPU from
sm_80 on: ``moe_align_block_size`` sorts the slots into blocks of one expert, gemm1 (``moe_wna16_marlin_gemm``,
gate rows first), SiLU(gate) * up, gemm2 (top-k weights applied), ``moe_sum`` (skips ids < 0, the slots of
other ranks' experts). Its library is built from vLLM's sources by ``bench/peers/build_marlin.py``;
``load_marlin(path)`` loads it. The weight conversion follows vLLM's ``prepare_nvfp4_moe_layer_for_marlin``:
each expert's codes through ``gptq_marlin_repack``; block scales permuted to Marlin's order and re-encoded
as "S0E5M3" (scale x 2^7 with one power-of-two factor shared by all experts, values under 2 zeroed, the
half's bits shifted left by one and the high byte kept); the global scale times 2^(126-7) over that factor.

Marlin keeps one global scale per expert for gemm1, where the checkpoint has one for gate and one for up
(ModelOpt's export ties them; vLLM warns when they differ). ``tie_gate_up`` requantizes a layer's w13 with
one global scale per expert, so that Marlin and the op run the same weights.

This module imports without the library: everything but ``convert``/``marlin_moe`` is plain torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_glm5 import nvfp4
from sglang_glm5.testing import MoeLayer

BLOCK_SIZES = (8, 16, 32, 48, 64)  # Marlin's moe_block_size candidates, in vLLM's order
# vLLM ScalarType id of float4_e2m1f: exponent 2 | mantissa 1 << 8 | signed << 16 | bias 0 << 17 |
# finite_values_only << 49 | nan_repr NONE << 50 (``vllm/scalar_type.py``, ``ScalarType.id``).
FE2M1F_ID = 2 | 1 << 8 | 1 << 16 | 1 << 49
SCALE_EXPONENT_SHIFT = 7  # S0E5M3 scales are stored times 2^7
BF16_EXPONENT_BIAS = 2 ** (8 - 1) - 2 ** (2 - 1)  # 126: e2m1 dequantized into bf16's exponent field
_LOADED: set[str] = set()


def load_marlin(path: str | Path) -> None:
    """Load the Marlin peer library (``bench/peers/build_marlin.py``'s output): registers ``torch.ops._moe_C``
    (``moe_wna16_marlin_gemm``, ``moe_align_block_size``, ``moe_sum``) and ``torch.ops._C.gptq_marlin_repack``."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no Marlin peer library at {path}: build it with bench/peers/build_marlin.py")
    if str(path) not in _LOADED:
        torch.ops.load_library(str(path))
        _LOADED.add(str(path))


def block_size_m(num_tokens: int, num_experts: int, num_global_experts: int, top_k: int) -> int:
    """vLLM's moe_block_size for Marlin: the first of 8, 16, 32, 48, 64 with M_eff * k / E / block < 0.9,
    M_eff = ceil(M * E / global E) (the tokens a rank is expected to see)."""
    m_eff = math.ceil(num_tokens * num_experts / num_global_experts)
    for block in BLOCK_SIZES:
        if m_eff * top_k / num_experts / block < 0.9:
            return block
    return BLOCK_SIZES[-1]


def scale_perm() -> list[int]:
    """Marlin's permutation of each run of 64 block scales along N (``marlin_utils.get_scale_perms``, grouped)."""
    return [i + 8 * j for i in range(8) for j in range(8)]


def scale_factor(scales: torch.Tensor) -> float:
    """The power of two, >= 1, shared by all of a tensor's experts, that brings the largest non-zero block scale
    x 2^7 to at most 448 x 2^7 (vLLM's ``_nvfp4_compute_scale_factor`` for bf16 activations)."""
    values = scales.to(torch.bfloat16).float() * 2**SCALE_EXPONENT_SHIFT
    nonzero = values[values > 0]
    if nonzero.numel() == 0:
        return 1.0
    top = nonzero.max()
    if top >= 448 * 2**SCALE_EXPONENT_SHIFT:
        return 1.0
    return float(torch.floor(torch.log2(448 * 2**SCALE_EXPONENT_SHIFT / top)).exp2())


def marlin_scales(scale: torch.Tensor, factor: float) -> torch.Tensor:
    """One expert's block scales [N, K/16] e4m3 (linear) -> Marlin's [K/16, N] e4m3 bytes ("S0E5M3")."""
    n, groups = scale.shape
    if n % 64:
        raise ValueError(f"marlin_scales: N must be a multiple of 64, got {n}")
    s = scale.to(torch.bfloat16).T.contiguous()  # [K/16, N], as vLLM: scales.to(params_dtype), then .T
    s = s.reshape(-1, 64)[:, scale_perm()].reshape(groups, n)
    s = s.to(torch.half)
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(groups, n)
    if factor > 1.0:
        s = (s.float() * factor).to(torch.half)
    s = s * 2**SCALE_EXPONENT_SHIFT
    s[s < 2] = 0
    bits = s.view(torch.int16) << 1
    return bits.view(torch.float8_e4m3fn)[:, 1::2].contiguous()


def decode_marlin_scales(encoded: torch.Tensor, factor: float) -> torch.Tensor:
    """The inverse of ``marlin_scales`` on the values it keeps: [K/16, N] bytes -> [N, K/16] fp32 block scales
    (zeroed ones stay 0)."""
    groups, n = encoded.shape
    bits = encoded.view(torch.uint8).to(torch.int16) << SCALE_EXPONENT_SHIFT  # the half's exponent and mantissa
    s = bits.view(torch.half).float() / (2**SCALE_EXPONENT_SHIFT * factor)
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(groups, n)  # [0, 2, 1, 3] is its own inverse
    inverse = torch.argsort(torch.tensor(scale_perm()))
    s = s.reshape(-1, 64)[:, inverse].reshape(groups, n)
    return s.T.contiguous()


def marlin_global_scale(global_scale: torch.Tensor, factor: float) -> torch.Tensor:
    """fp32 [E]: the checkpoint's global scale x 2^(126 - 7) / factor (vLLM, bf16 activations)."""
    return global_scale.float() * 2.0 ** (BF16_EXPONENT_BIAS - SCALE_EXPONENT_SHIFT) / factor


def tie_gate_up(layer: MoeLayer) -> MoeLayer:
    """The layer with w13 requantized per expert under one global scale for gate and up (ModelOpt's
    amax / (448 * 6) over both halves), as Marlin needs; w2 unchanged. Experts already tied stay as they are."""
    num_experts, two_i, _ = layer.w13.shape
    inter = two_i // 2
    w13, s13, g13 = layer.w13.clone(), layer.w13_scale.clone(), layer.w13_scale_2.clone().reshape(num_experts, -1)
    for e in range(num_experts):
        if g13.shape[1] == 1 or g13[e, 0] == g13[e, 1]:
            continue
        gate = nvfp4.dequantize(layer.w13[e, :inter], layer.w13_scale[e, :inter], g13[e, 0])
        up = nvfp4.dequantize(layer.w13[e, inter:], layer.w13_scale[e, inter:], g13[e, 1])
        q = nvfp4.quantize(torch.cat([gate, up]))
        w13[e], s13[e], g13[e] = q.packed, q.scale, q.global_scale
    g13 = g13.expand(num_experts, 2).contiguous()
    return MoeLayer(w13, s13, g13, layer.w2, layer.w2_scale, layer.w2_scale_2)


@dataclass(frozen=True)
class MarlinWeights:
    """A layer in Marlin's layout (``convert``)."""

    w13: torch.Tensor  # [E, H/16, 2 * 2I] int32
    w13_scale: torch.Tensor  # [E, H/16, 2I] e4m3 bytes (S0E5M3)
    w13_global: torch.Tensor  # [E] fp32
    w2: torch.Tensor  # [E, I/16, 2H] int32
    w2_scale: torch.Tensor  # [E, I/16, H] e4m3 bytes (S0E5M3)
    w2_global: torch.Tensor  # [E] fp32
    workspace: torch.Tensor  # [SMs * 4] int32 zeros (Marlin's locks; it resets them after each call)
    hidden: int
    inter: int

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


def _repack(packed: torch.Tensor, size_n: int, size_k: int) -> torch.Tensor:
    """[E, N, K/2] uint8 -> [E, K/16, 2N] int32 through ``gptq_marlin_repack``, one expert at a time (vLLM)."""
    return torch.stack(
        [torch.ops._C.gptq_marlin_repack(w.view(torch.int32).T.contiguous(), size_k, size_n, 4) for w in packed]
    )


def convert(layer: MoeLayer) -> MarlinWeights:
    """A layer whose gate and up share their global scale (``tie_gate_up``), on a CUDA device, in Marlin's layout."""
    num_experts, two_i, half_h = layer.w13.shape
    hidden, inter = 2 * half_h, two_i // 2
    g13 = layer.w13_scale_2.reshape(num_experts, -1)
    if g13.shape[1] == 2 and not torch.equal(g13[:, 0], g13[:, 1]):
        raise ValueError("convert: gate and up have different global scales; Marlin takes one (tie_gate_up)")
    if not layer.w13.is_cuda:
        raise ValueError(f"convert: the layer must be on a CUDA device, got {layer.w13.device}")

    def scales(scale: torch.Tensor) -> tuple[torch.Tensor, float]:
        factor = scale_factor(scale)
        return torch.stack([marlin_scales(s, factor) for s in scale]), factor

    s13, f13 = scales(layer.w13_scale)
    s2, f2 = scales(layer.w2_scale)
    sms = torch.cuda.get_device_properties(layer.w13.device).multi_processor_count
    return MarlinWeights(
        w13=_repack(layer.w13, two_i, hidden),
        w13_scale=s13,
        w13_global=marlin_global_scale(g13[:, 0], f13).contiguous(),
        w2=_repack(layer.w2, hidden, inter),
        w2_scale=s2,
        w2_global=marlin_global_scale(layer.w2_scale_2.reshape(num_experts), f2).contiguous(),
        workspace=torch.zeros(sms * 4, dtype=torch.int32, device=layer.w13.device),
        hidden=hidden,
        inter=inter,
    )


def align(topk_ids: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``moe_align_block_size`` on local ids (-1 and ids outside [0, E) dropped): (sorted slot ids, each block's
    expert, the padded slot count [1]), sized as vLLM sizes them."""
    numel = topk_ids.numel()
    padded = numel + num_experts * (block - 1)
    if numel < num_experts:
        padded = min(numel * block, padded)
    device = topk_ids.device
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(-(-padded // block), dtype=torch.int32, device=device)
    post_pad = torch.empty(1, dtype=torch.int32, device=device)
    torch.ops._moe_C.moe_align_block_size(topk_ids, num_experts, block, sorted_ids, expert_ids, post_pad, None, None)
    return sorted_ids, expert_ids, post_pad


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[R, 2I] -> [R, I]: SiLU(gate) * up in fp32, one launch (as vLLM's ``silu_and_mul``)."""
    from sglang_glm5.kernels.silu_mul import silu_mul_kernel

    rows, two_i = gate_up.shape
    out = torch.empty(rows, two_i // 2, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    silu_mul_kernel[(rows, -(-(two_i // 2) // block))](src=gate_up, dst=out, inter=two_i // 2, BLOCK=block)
    return out


def marlin_moe(
    x: torch.Tensor,
    weights: MarlinWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_global_experts: int | None = None,
) -> torch.Tensor:
    """vLLM's ``fused_marlin_moe`` for NVFP4 x bf16 on local ids (-1: another rank's expert): [M, H] bf16."""
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, inter = weights.num_experts, weights.inter
    block = block_size_m(num_tokens, num_experts, num_global_experts or num_experts, top_k)
    sorted_ids, expert_ids, post_pad = align(topk_ids, num_experts, block)
    gemm = torch.ops._moe_C.moe_wna16_marlin_gemm
    gate_up = torch.empty(num_tokens * top_k, 2 * inter, dtype=x.dtype, device=x.device)
    gemm(x, gate_up, weights.w13, None, weights.w13_scale, weights.w13_global, None, weights.workspace, sorted_ids,
         expert_ids, post_pad, topk_weights, block, top_k, False, FE2M1F_ID, num_tokens, 2 * inter, hidden, False,
         True, False, -1, -1, -1)  # fmt: skip
    h = silu_mul(gate_up)
    down = torch.empty(num_tokens * top_k, hidden, dtype=x.dtype, device=x.device)
    gemm(h, down, weights.w2, None, weights.w2_scale, weights.w2_global, None, weights.workspace, sorted_ids,
         expert_ids, post_pad, topk_weights, block, 1, True, FE2M1F_ID, num_tokens * top_k, hidden, inter, False,
         True, False, -1, -1, -1)  # fmt: skip
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    torch.ops._moe_C.moe_sum(down.view(num_tokens, top_k, hidden), out, topk_ids, None)
    return out
