"""Torch reference of the NVFP4 fused MoE: the same signature as ``sglang_glm5.moe.nvfp4_fused_moe``.

Dequantizes every weight to float64 and loops over experts. Slow and exact; tests and benchmarks
compare against it.
"""

from __future__ import annotations

import torch

from sglang_glm5 import nvfp4


def nvfp4_fused_moe_reference(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_order: str = "gate_up",
    out_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * (silu(x Wg^T) * (x Wu^T)) W2^T over slots with 0 <= topk_ids[t, j] < E."""
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    x = hidden_states.double()
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    gs13 = w13_scale_2.double().reshape(num_experts, -1).expand(num_experts, 2)
    for e in range(num_experts):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        first = nvfp4.dequantize(w13[e, :inter], w13_scale[e, :inter], 1.0, torch.float64)
        second = nvfp4.dequantize(w13[e, inter:], w13_scale[e, inter:], 1.0, torch.float64)
        if w13_order == "gate_up":
            w_gate, w_up = first * gs13[e, 0], second * gs13[e, 1]
        elif w13_order == "up_gate":
            w_up, w_gate = first * gs13[e, 1], second * gs13[e, 0]
        else:
            raise ValueError(f"w13_order must be 'gate_up' or 'up_gate', got {w13_order!r}")
        w_down = nvfp4.dequantize(w2[e], w2_scale[e], 1.0, torch.float64) * w2_scale_2[e].double()
        xe = x[token]
        h = torch.nn.functional.silu(xe @ w_gate.T) * (xe @ w_up.T)
        y = (h @ w_down.T) * topk_weights[token, slot].double()[:, None]
        out.index_add_(0, token, y)
    return out.to(out_dtype)
