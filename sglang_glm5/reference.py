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


def align_pairs_by_expert_reference(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch version of ``sglang_glm5.routing.align_pairs_by_expert``, with the same output.

    Returns (sorted_ids [num_blocks * block_m] int32, block_expert [num_blocks] int32). Pair ids in a
    block are in increasing order; slots past an expert's count hold P (padding). Blocks past the
    last used one, and ids outside [0, E), get expert -1. num_blocks is the upper bound
    floor((P + min(P, E) * (block_m - 1)) / block_m) + 1, so the sizes never depend on the ids' values.
    """
    ids = topk_ids.reshape(-1)
    num_pairs = ids.numel()
    device = ids.device
    valid = (ids >= 0) & (ids < num_experts)
    key = torch.where(valid, ids, num_experts).to(torch.int64)  # invalid pairs sort last
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    blocks_per_expert = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks_per_expert, 0)  # [E], in blocks
    pair_start = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    num_blocks = (num_pairs + min(num_pairs, num_experts) * (block_m - 1)) // block_m + 1

    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - pair_start.index_select(
        0, sorted_key.clamp(max=num_experts - 1)
    )
    block_start_rows = (block_end - blocks_per_expert) * block_m
    dest = block_start_rows.index_select(0, sorted_key.clamp(max=num_experts - 1)) + rank_in_expert
    dump = num_blocks * block_m  # invalid pairs are written to one extra slot, then cut off
    dest = torch.where(sorted_key < num_experts, dest, dump)
    sorted_ids = torch.full((dump + 1,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_expert = torch.searchsorted(block_end, torch.arange(num_blocks, device=device), right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids[:dump], block_expert
