"""NVFP4 W4A4 fused MoE: activations quantized to NVFP4, block-scaled FP4 tensor cores on SM12x.

    T = tokens, H = hidden size, I = intermediate size per expert, E = local experts, k = top-k

The math, which ``nvfp4_fused_moe_w4a4_emulated`` computes in torch and the kernels in
``sglang_glm5.kernels.nvfp4_w4a4`` compute on the GPU:

1. x is quantized to NVFP4 along H in blocks of 16 with the global scale a1 = max(w13_input_scale)
   (one scalar for all experts, as SGLang's flashinfer_cutlass path, the SM120 default, does).
2. gate = (Qx @ Qwg^T) * a1 * gs_gate and up likewise, where Q. is e2m1 * e4m3 block scale (exact in
   fp32) and the products are accumulated in fp32.
3. h = silu(gate) * up in fp32, quantized to NVFP4 along I with the global scale a2 = w2_input_scale[e].
4. y = (Qh @ Qw2^T) * a2 * gs2[e] * topk_weight, rounded to the output dtype per (token, slot);
   out = the fp32 sum of y over the valid slots, rounded to the output dtype.

Convention for ``input_scale`` (ModelOpt, read in SGLang 0.5.23 ``modelopt_quant.py``): the checkpoint
value is amax / (448 * 6) and **multiplies** on dequantization: SGLang passes ``1 / input_scale``
(``w13_input_scale_quant``) to the quantizer, which multiplies by it, and ``input_scale * weight_scale_2``
(``g1_alphas`` / ``g2_alphas``) to the GEMM epilogue. Here the quantizer divides by input_scale (the
same value up to the rounding of the reciprocal) and the epilogue multiplies.

This path has NOT run on SM120 hardware: its kernels are only compiled ahead of time for sm_120 and
checked through an interpreter variant that replaces ``dot_scaled`` by a decoded fp32 dot.
"""

from __future__ import annotations

import torch

from sglang_glm5 import autotune, hardware, nvfp4
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.variants import w4a4 as family
from sglang_glm5.weights import Nvfp4MoeWeights, per_expert_scale

__all__ = [
    "nvfp4_fused_moe_w4a4",
    "nvfp4_fused_moe_w4a4_emulated",
]

# ---------------------------------------------------------------------------------------------
# CPU emulation: exactly the W4A4 math, in torch.


def quantize_dequantize(x: torch.Tensor, global_scale: torch.Tensor | float) -> torch.Tensor:
    """x [..., K] -> fp32 values of its NVFP4 quantization with the given (multiplying) global scale."""
    return nvfp4.quantize(x.float(), global_scale).dequantize(torch.float32)


def _unit(x: torch.Tensor, global_scale: torch.Tensor | float) -> torch.Tensor:
    """NVFP4 values without the global scale (e2m1 * e4m3): what the tensor cores multiply."""
    q = nvfp4.quantize(x.float(), global_scale)
    return nvfp4.dequantize(q.packed, q.scale, 1.0, torch.float32)


def nvfp4_fused_moe_w4a4_emulated(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_input_scale: torch.Tensor | float,
    w2_input_scale: torch.Tensor | float,
    *,
    w13_order: str = "gate_up",
) -> torch.Tensor:
    """The W4A4 MoE on the CPU (module docstring); [T, H] -> [T, H], dtype of hidden_states."""
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    if w13_order not in ("gate_up", "up_gate"):
        raise ValueError(f"w13_order must be 'gate_up' or 'up_gate', got {w13_order!r}")
    a1 = torch.as_tensor(w13_input_scale, dtype=torch.float32).max()
    a2 = per_expert_scale(w2_input_scale, num_experts, "w2_input_scale", hidden_states.device)
    gs13 = w13_scale_2.float().reshape(num_experts, -1).expand(num_experts, 2)
    out_dtype = hidden_states.dtype
    xq = _unit(hidden_states, a1)  # [T, H]
    acc = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for e in range(num_experts):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        w = nvfp4.dequantize(w13[e], w13_scale[e], 1.0, torch.float32)
        first, second = w[:inter], w[inter:]
        w_gate, w_up = (first, second) if w13_order == "gate_up" else (second, first)
        xe = xq[token]
        gate = (xe @ w_gate.T) * (a1 * gs13[e, 0])
        up = (xe @ w_up.T) * (a1 * gs13[e, 1])
        h = torch.nn.functional.silu(gate) * up
        hq = _unit(h, a2[e])
        w_down = nvfp4.dequantize(w2[e], w2_scale[e], 1.0, torch.float32)
        y = (hq @ w_down.T) * (a2[e] * w2_scale_2[e].float() * topk_weights[token, slot].float()[:, None])
        acc.index_add_(0, token, y.to(out_dtype).float())
    return acc.to(out_dtype)


def run_w4a4(
    hidden_states: torch.Tensor,
    weights: Nvfp4MoeWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out: torch.Tensor,
    config: MoeConfig | None = None,
    emulate_dot: bool = False,
    num_global_experts: int | None = None,
) -> torch.Tensor:
    """The W4A4 op on arguments ``moe.fused_moe`` validated (T > 0, the ids in range), into ``out``.
    ``emulate_dot``: the interpreter tests' kernels (``dot_scaled`` replaced by a decoded fp32 dot)."""
    from sglang_glm5.routing import interpreting, routes_for, sum_over_slots

    if not weights.has_input_scales:
        raise RuntimeError("the W4A4 path quantizes activations with the checkpoint's input scales: the weights "
                           "were built without w13_input_scale and w2_input_scale")  # fmt: skip
    if weights.layout != "checkpoint":
        raise RuntimeError(f"the W4A4 path reads the checkpoint's codes and block scales; these weights are in "
                           f"the {weights.layout!r} layout (for_device(w4a4=True) keeps them)")  # fmt: skip
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = weights.shape
    device = hidden_states.device
    num_pairs = num_tokens * top_k
    tokens_per_expert = num_pairs / (num_global_experts or num_experts)  # as moe.fused_moe estimates it
    cfg = config or autotune.pick_config("w4a4", tokens_per_expert, num_experts, hidden, inter, device)
    interpret = interpreting()
    topk_ids = topk_ids.contiguous()
    gate_row0, up_row0 = weights.gate_up_rows
    a1, a2 = weights.a1, weights.a2

    xq, xs = family.quantize_activations(hidden_states, a1)
    hq = torch.empty((num_pairs, inter // 2), dtype=torch.uint8, device=device)
    hs = torch.zeros((num_pairs, inter // 16), dtype=torch.uint8, device=device)
    route1, route2 = routes_for(topk_ids, num_experts, cfg)
    family.launch_gemm1(
        xq, xs, a1, weights.w13, weights.w13_scale, weights.w13_scale_2, a2, route1, hq, hs, cfg.gemm1, top_k,
        gate_row0, up_row0, emulate_dot,
    )  # fmt: skip
    y = torch.empty((num_pairs, hidden), dtype=hidden_states.dtype, device=device)
    family.launch_gemm2(
        hq, hs, a2, weights.w2, weights.w2_scale, weights.w2_scale_2, topk_weights.reshape(-1).contiguous(), route2,
        y, cfg.gemm2, emulate_dot, interpret,
    )  # fmt: skip
    sum_over_slots(y, topk_ids, out, num_experts, interpret)
    return out


def nvfp4_fused_moe_w4a4(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_input_scale: torch.Tensor,
    w2_input_scale: torch.Tensor,
    *,
    w13_order: str = "gate_up",
    config: MoeConfig | None = None,
    check_ids: bool = True,
    num_global_experts: int | None = None,
    emulate_dot: bool = False,
) -> torch.Tensor:
    """W4A4 NVFP4 MoE on SM12x tensor cores; the arguments of ``nvfp4_fused_moe`` plus the input scales.

    w13_input_scale: scalar, [E] or [E, 2] fp32 (its max is the one activation global scale);
    w2_input_scale: scalar or [E] fp32 local-expert scales. config: W4A4 tiles (default: the W4A4
    entries of the autotune cache for T * k / num_global_experts tokens per expert, else
    ``variants.w4a4.heuristic_config``). check_ids, num_global_experts: as in ``nvfp4_fused_moe`` (the id range check
    syncs with the host). Raises RuntimeError off SM12x GPUs (the block-scaled FP4 mma exists only there;
    sm_90 compiles dot_scaled to a bf16 upcast) unless ``emulate_dot`` (the interpreter tests).
    NOT YET RUN ON SM120 HARDWARE.
    """
    from sglang_glm5.routing import check_ids_in_range, check_options, validate_call

    if not emulate_dot:
        got = hardware.w4a4_problem(hidden_states.device if isinstance(hidden_states, torch.Tensor) else None)
        if got is not None:
            raise RuntimeError(f"nvfp4_fused_moe_w4a4 needs an SM12x (Blackwell workstation) CUDA GPU, got {got}")
    weights = Nvfp4MoeWeights.build(
        w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, w13_order=w13_order,
        w13_input_scale=w13_input_scale, w2_input_scale=w2_input_scale,
    )  # fmt: skip
    num_tokens, _ = validate_call(hidden_states, weights, topk_weights, topk_ids)
    out = torch.empty((num_tokens, weights.hidden), dtype=hidden_states.dtype, device=hidden_states.device)
    if num_tokens == 0:
        return out
    if check_ids:
        check_ids_in_range(topk_ids, weights.num_experts)
    check_options(config, num_global_experts, weights.num_experts)
    return run_w4a4(hidden_states, weights, topk_weights, topk_ids, out=out, config=config, emulate_dot=emulate_dot,
                    num_global_experts=num_global_experts)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The W4A4 side of the autotune cache. W4A4 tiles live in the same files as the W4A16 ones, as
# ``autotune.Entry`` values under "entries", with keys in ``autotune.cache_key``'s format (same owners:
# measured per device, unmeasured per architecture and shared memory) for kernels "w4a4_gemm1" |
# "w4a4_gemm2" and W4A4's own KERNEL_REVISION (``variants.w4a4``: a new W4A16 design does not retire W4A4
# tiles). The tokens per expert from which resolve_path("auto") picks W4A4, measured by a passing
# ``tune --path w4a4`` (``sglang_glm5.w4a4_tune.after_tune``), sit in the file's top-level
# "w4a4_threshold" object, keyed by GPU and layer shape (never in "entries", whose values are configs).

THRESHOLD_KEY = "w4a4_threshold"


def threshold_key(target, shape) -> str:
    """The key of the measured threshold of a layer shape on a target (under W4A4's kernel revision)."""
    e, h, i = shape.num_experts, shape.hidden, shape.inter
    return f"{autotune.owner(target, measured=True)}|w4a4.r{family.KERNEL_REVISION}|E={e},H={h},I={i}"


def store_threshold(
    path, target, shape, min_tokens: float | None, timings: dict[int, tuple[float, float]], *, checked: list[int]
) -> None:  # fmt: skip
    """Store the measured tokens per expert from which W4A4 is picked (None: never), with the buckets whose
    tiles passed the check against the float64 reference (``checked``: auto runs W4A4 at those only), locked
    and atomic. ``tune --path w4a4`` stores a number only after that check passed."""
    import triton

    from sglang_glm5._files import update_json

    value = {
        "min_tokens_per_expert": min_tokens,
        "checked_buckets": [int(b) for b in checked],
        "measured": True,
        "triton": triton.__version__,
        "ms": {str(b): {"w4a16": t16, "w4a4": t4} for b, (t16, t4) in sorted(timings.items())},
    }

    def update(data: dict) -> None:
        table = data.get(THRESHOLD_KEY)
        table = table if isinstance(table, dict) else {}
        table[threshold_key(target, shape)] = value
        data[THRESHOLD_KEY] = table

    update_json(path, update)


def remove_threshold(path, target, shape) -> None:
    """Remove this GPU's threshold for ``shape`` from a cache file (a tune whose check failed), locked and atomic."""
    from sglang_glm5._files import update_json

    def update(data: dict) -> None:
        table = data.get(THRESHOLD_KEY)
        if isinstance(table, dict):
            table.pop(threshold_key(target, shape), None)

    update_json(path, update)


def load_threshold(target, shape, paths=None) -> dict | None:
    """The stored threshold entry ({"min_tokens_per_expert": number or None, ...}) of a passing
    ``tune --path w4a4`` on this kind of GPU, from the first file that has it (``autotune.cache_files``:
    the user's over the shipped ones); None when none has one. Broken files and entries are reported once."""
    paths = autotune.cache_files(target) if paths is None else paths
    key = threshold_key(target, shape)
    for path in paths:
        data = autotune.read_cache_file(path)
        table = data.get(THRESHOLD_KEY) if data is not None else None
        value = table.get(key) if isinstance(table, dict) else None
        if value is None:
            continue
        m = value.get("min_tokens_per_expert", "missing") if isinstance(value, dict) else "missing"
        checked = value.get("checked_buckets") if isinstance(value, dict) else None
        number = isinstance(m, int | float) and not isinstance(m, bool) and m >= 0
        buckets = isinstance(checked, list) and all(isinstance(b, int) and not isinstance(b, bool) for b in checked)
        if (m is None or number) and buckets:
            return value
        autotune.report_once(f"{path}: skipping W4A4 threshold {key!r}: expected min_tokens_per_expert a number "
                             f">= 0 or null and checked_buckets a list of ints, got {m!r} and {checked!r}")  # fmt: skip
    return None
