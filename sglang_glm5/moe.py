"""The public op: NVFP4 fused mixture-of-experts (W4A16), on Triton kernels.

    T = tokens, H = hidden size, I = intermediate size per expert, E = local experts, k = top-k

``nvfp4_fused_moe`` validates its inputs and picks a path:

- W4A4 on SM12x when asked for, or by "auto" once proven on that GPU (``sglang_glm5.w4a4_select``);
- dense prefill on sm_90 / sm_100 from ``prefill.min_tokens()`` tokens per expert
  (``sglang_glm5.prefill``: weights dequantized once to bf16, torch grouped GEMMs);
- otherwise the W4A16 kernels: sort the (token, slot) pairs by expert, write the activations in the
  kernels' K order (written by the routing launch), gemm1 (gate/up with fused SiLU * up), gemm2 (down
  projection times the routing weight) and a deterministic sum over the k slots.

The torch reference with the same signature is ``sglang_glm5.reference.nvfp4_fused_moe_reference``.
"""

from __future__ import annotations

import torch

from sglang_glm5 import autotune, prefill
from sglang_glm5.routing import check_ids_in_range, check_options, interpreting, validate_call
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.variants import PATHS, w4a16, w4a16_plan
from sglang_glm5.weights import Nvfp4MoeWeights

__all__ = ["PATHS", "fused_moe", "nvfp4_fused_moe"]


def _dense_prefill(device: torch.device, tokens_per_expert: float) -> bool:
    """Whether ``sglang_glm5.prefill`` (dequantize once + grouped GEMM) serves this call."""
    return prefill.available(device) and tokens_per_expert >= prefill.min_tokens()


def nvfp4_fused_moe(
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
    config: MoeConfig | None = None,
    path: str = "auto",
    w13_input_scale: torch.Tensor | float | None = None,
    w2_input_scale: torch.Tensor | float | None = None,
    check_ids: bool = True,
    num_global_experts: int | None = None,
    settings: w4a16_plan.PlanSettings | None = None,
) -> torch.Tensor:
    """NVFP4 mixture of experts: [T, H] hidden states -> [T, H], dtype of hidden_states.

    hidden_states [T, H] bf16/fp16; w13 [E, 2I, H/2] uint8 with w13_scale [E, 2I, H/16] e4m3 (linear
    layout) and w13_scale_2 [E] or [E, 2] fp32 (gate, up); w2 [E, H, I/2] uint8, w2_scale
    [E, H, I/16] e4m3, w2_scale_2 [E] fp32; topk_weights [T, k] fp32 (routed scaling included);
    topk_ids [T, k] int32/int64 local expert ids, -1 = expert not on this rank.
    w13_order: "gate_up" when w13 rows are [gate; up], "up_gate" when [up; gate].
    w13_input_scale, w2_input_scale: the checkpoint's activation scales, needed by the W4A4 path.
    The weights are checked on every call here; a caller that keeps them (a server) builds an
    ``Nvfp4MoeWeights`` once and calls ``fused_moe``. The other keywords are ``fused_moe``'s.
    """
    weights = Nvfp4MoeWeights.build(
        w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, w13_order=w13_order,
        w13_input_scale=w13_input_scale, w2_input_scale=w2_input_scale,
    )  # fmt: skip
    return fused_moe(
        hidden_states, weights, topk_weights, topk_ids, config=config, path=path, check_ids=check_ids,
        num_global_experts=num_global_experts, settings=settings,
    )  # fmt: skip


def fused_moe(
    hidden_states: torch.Tensor,
    weights: Nvfp4MoeWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: MoeConfig | None = None,
    path: str = "auto",
    check_ids: bool = True,
    num_global_experts: int | None = None,
    settings: w4a16_plan.PlanSettings | None = None,
) -> torch.Tensor:
    """``nvfp4_fused_moe`` on a layer's checked weights (``Nvfp4MoeWeights.build``).

    config: tiles for the W4A16 kernels (default: the autotune cache, else the heuristic); with
    path="auto" a config also keeps the call on those kernels (no W4A4, no dense prefill).
    path: "w4a16" (the W4A16 kernels only), "w4a4" (SM12x only: activations quantized to
    NVFP4 with the weights' input scales, block-scaled FP4 tensor cores), "dense" (sm_90 / sm_100: the
    weights dequantized once to bf16, grouped GEMMs), or "auto" (``w4a4_select.resolve_path``, then dense
    prefill from ``prefill.min_tokens()`` tokens per expert where it runs, else W4A16).
    check_ids: raise on expert ids outside [-1, E). Costs a device-to-host sync per call (skipped
    during CUDA-graph capture); callers whose ids are valid by construction turn it off.
    num_global_experts: experts across all ranks, when the ids mark other ranks' experts -1 (expert
    parallelism). Tiles and paths are chosen by tokens per expert, estimated without a sync as
    T * k / num_global_experts (default E: every slot local).
    settings: how the W4A16 kernels plan a call (``w4a16_plan.PlanSettings``; default
    ``w4a16_plan.default_settings()``, the defaults and the environment's switches).
    """
    num_tokens, top_k = validate_call(hidden_states, weights, topk_weights, topk_ids)
    num_experts, hidden, inter = weights.shape
    out = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=hidden_states.device)
    if num_tokens == 0:
        return out
    if check_ids:
        check_ids_in_range(topk_ids, num_experts)
    check_options(config, num_global_experts, num_experts)
    if settings is not None and not isinstance(settings, w4a16_plan.PlanSettings):
        raise TypeError(f"settings: expected w4a16_plan.PlanSettings or None, got {type(settings).__name__}")
    tokens_per_expert = num_tokens * top_k / (num_global_experts or num_experts)
    if path not in PATHS:
        raise ValueError(f"path: expected one of {', '.join(repr(p) for p in PATHS)}, got {path!r}")
    if path == "dense" and (config is not None or not prefill.available(hidden_states.device)):
        raise RuntimeError(f"path='dense' needs no config and a GPU with a native torch._grouped_mm (sm_90 / sm_100), "
                           f"got {'a config' if config is not None else hidden_states.device}")  # fmt: skip
    if path in ("auto", "w4a4") and not (path == "auto" and config is not None):  # a config is for W4A16
        from sglang_glm5.w4a4_select import resolve_path

        chosen = resolve_path(path, hidden_states.device, tokens_per_expert, weights.shape,
                              has_input_scales=weights.has_input_scales)  # fmt: skip
        # weights in the W4A16 kernel layout (a layer that could not take W4A4 when it was loaded, e.g. tuned
        # for W4A4 since): auto stays on W4A16; a forced "w4a4" gets run_w4a4's error
        if chosen == "w4a4" and (path == "w4a4" or weights.layout == "checkpoint"):
            from sglang_glm5.w4a4 import run_w4a4

            return run_w4a4(hidden_states, weights, topk_weights, topk_ids, out=out,
                            num_global_experts=num_global_experts)  # fmt: skip
    topk_ids = topk_ids.contiguous()
    dense = path == "auto" and config is None and not interpreting()
    if path == "dense" or (dense and _dense_prefill(hidden_states.device, tokens_per_expert)):
        return prefill.dense_moe(hidden_states, weights, topk_weights, topk_ids, out=out)
    device = hidden_states.device
    config = config or autotune.pick_config("w4a16", tokens_per_expert, num_experts, hidden, inter, device)
    return w4a16.run(hidden_states, weights, topk_weights, topk_ids, out=out, config=config,
                     num_global_experts=num_global_experts, settings=settings)  # fmt: skip
