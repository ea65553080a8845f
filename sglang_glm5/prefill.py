"""Dense prefill on Hopper: dequantize the layer's NVFP4 weights to bf16 once, then grouped GEMMs.

    T = tokens, H = hidden size, I = intermediate size per expert, E = local experts, k = top-k

With many tokens per expert the MoE is compute-bound, and a W4A16 kernel decodes every weight
tile once per block of tokens. Here each weight is decoded once per call (``nvfp4_dequant_kernel``,
exact in bf16), and torch's ``_grouped_mm`` (CUTLASS grouped GEMM on sm_90 / sm_100) multiplies
the pairs sorted by expert:

    gu = x[sorted pairs] @ W13[e]^T          [P, 2I]   then * global scale (gate, up) per row
    h  = silu(gate) * up                     [P, I]
    y  = h @ W2[e]^T * global scale * topk   [P, H]    (scales folded into h before its rounding)
    out[t] = sum over valid slots of y       (the kernel path's deterministic sum, reading rows by map)

Cost: one pass over the weights (reading 0.56 bytes and writing 2 per element) and a bf16 scratch
of E * 2I * H * 2 bytes (1.6 GB for the GLM-5 EP8 layer), reused for w2. Taken by
``nvfp4_fused_moe`` only where ``available`` holds and tokens per expert reach ``min_tokens``.
"""

from __future__ import annotations

import torch

from sglang_glm5 import env, hardware
from sglang_glm5._ints import cdiv

ENV_MIN_TOKENS = env.DENSE_PREFILL_MIN_TOKENS.name
# Tokens per expert from which this path serves the call: on an H200 the W4A16 kernels were faster at 256 (GLM-5
# B = 8192: 2.36-2.45 against 2.73-2.85 ms EP8, 3.01-3.07 against 3.27-3.29 TP8) and this path at 512 (B = 16384:
# 3.93-4.09 against 4.54 EP8, 5.06-5.15 against 6.25 TP8); 384 lies between the two measured sizes.
DEFAULT_MIN_TOKENS = int(env.DENSE_PREFILL_MIN_TOKENS.default)


def available(device: torch.device) -> bool:
    """True on CUDA GPUs where torch's bf16 _grouped_mm is a native grouped GEMM (sm_90, sm_100):
    ``hardware.dense_prefill_available``."""
    return hardware.dense_prefill_available(device)


def min_tokens() -> float:
    """The switch-over point in tokens per expert; ``SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS`` overrides it
    (0 = always, a huge value = never)."""
    return env.get(env.DENSE_PREFILL_MIN_TOKENS)


def dequantize_bf16(
    packed: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None, *, layout: str = "checkpoint"
) -> torch.Tensor:
    """packed [..., N, K/2] uint8 + scale [..., N, K/16] e4m3 (or codes and scale codes in the kernel
    ``layout``, ``nvfp4.LAYOUTS``) -> [..., N, K] bf16 e2m1 * scale (exact)."""
    from sglang_glm5.kernels.dense_prefill import nvfp4_dequant_kernel
    from sglang_glm5.nvfp4 import LAYOUTS

    k = packed.shape[-1] * 2
    rows = packed.numel() // packed.shape[-1]
    if out is None:
        out = torch.empty((*packed.shape[:-1], k), dtype=torch.bfloat16, device=packed.device)
    block_r, block_k = 32, 256
    nvfp4_dequant_kernel[(cdiv(rows, block_r), cdiv(k, block_k))](
        w_ptr=packed,
        ws_ptr=scale.view(torch.uint8),
        out_ptr=out,
        num_rows=rows,
        K=k,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        LAYOUT=LAYOUTS.index(layout),
    )
    return out


def dense_moe(hidden_states, weights, topk_weights, topk_ids, *, out: torch.Tensor) -> torch.Tensor:
    """The module docstring's path on a layer's ``Nvfp4MoeWeights``; arguments as validated by
    ``moe.fused_moe``. Writes ``out``."""
    from sglang_glm5.kernels.dense_prefill import dense_activation_kernel
    from sglang_glm5.routing import align_pairs_by_expert, interpreting, sum_over_slots

    num_tokens, hidden = hidden_states.shape
    num_experts, _, inter = weights.shape
    gate_row0 = weights.gate_up_rows[0]
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    device = hidden_states.device
    # Blocks of one pair: sorted_ids lists the valid pairs by expert, then P for padding; block_expert
    # is each row's expert (-1 past the valid ones). No host synchronization.
    sorted_ids, row_expert = align_pairs_by_expert(topk_ids, num_experts, 1)
    rows = sorted_ids.numel()
    valid = row_expert >= 0
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    counts.scatter_add_(0, row_expert.clamp(min=0).long(), valid.to(torch.int32))  # bincount would sync
    offs = torch.cumsum(counts, 0, dtype=torch.int32)  # end row of each expert's group
    pair = torch.where(valid, sorted_ids, 0).long()

    x_sorted = hidden_states.index_select(0, pair // top_k).to(torch.bfloat16)
    scratch = torch.empty((num_experts, 2 * inter, hidden), dtype=torch.bfloat16, device=device)
    w13_bf16 = dequantize_bf16(weights.w13, weights.w13_scale, scratch, layout=weights.layout)
    gu = torch._grouped_mm(x_sorted, w13_bf16.transpose(1, 2), offs=offs)  # [rows, 2I] bf16
    # h = silu(gate * gs_gate) * up * gs_up, times gs2 * topk_weight (linear in h, so applied before
    # gemm2 and its one rounding rather than to y). Padding rows are left unwritten: nothing reads them.
    h = torch.empty((rows, inter), dtype=torch.bfloat16, device=device)
    gs13 = weights.w13_scale_2
    block_i = 1024
    dense_activation_kernel[(rows, cdiv(inter, block_i))](
        gu_ptr=gu, row_expert_ptr=row_expert, sorted_ids_ptr=sorted_ids, wgs13_ptr=gs13, wgs2_ptr=weights.w2_scale_2,
        topk_weights_ptr=topk_weights.reshape(-1), h_ptr=h, inter_size=inter, stride_gur=gu.stride(0),
        stride_gse=gs13.stride(0), stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0, stride_hr=h.stride(0),
        gate_col0=gate_row0, up_col0=inter - gate_row0, BLOCK_I=block_i,
    )  # fmt: skip
    del gu
    w2 = weights.w2
    w2_scratch = scratch.view(-1)[: w2.numel() * 2].view(num_experts, hidden, inter)
    w2_bf16 = dequantize_bf16(w2, weights.w2_scale, w2_scratch, layout=weights.layout)
    y_sorted = torch._grouped_mm(h, w2_bf16.transpose(1, 2), offs=offs).to(hidden_states.dtype)
    # The sum reads y_sorted through row_map[pair] = its sorted row; padding rows write the spare
    # entry num_pairs, which nothing reads.
    row_map = torch.empty(num_pairs + 1, dtype=torch.int32, device=device)
    row_map.index_copy_(
        0, torch.where(valid, sorted_ids, num_pairs).long(), torch.arange(rows, dtype=torch.int32, device=device)
    )
    sum_over_slots(y_sorted, topk_ids, out, num_experts, interpreting(), row_map=row_map)
    return out
