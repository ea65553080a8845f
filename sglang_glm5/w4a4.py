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

import json
import sys
from dataclasses import dataclass

import torch

from sglang_glm5 import nvfp4
from sglang_glm5.tiles import GemmConfig, MoeConfig

# ---------------------------------------------------------------------------------------------
# CPU emulation: exactly the W4A4 math, in torch.


def quantize_dequantize(x: torch.Tensor, global_scale: torch.Tensor | float) -> torch.Tensor:
    """x [..., K] -> fp32 values of its NVFP4 quantization with the given (multiplying) global scale."""
    return nvfp4.quantize(x.float(), global_scale).dequantize(torch.float32)


def _unit(x: torch.Tensor, global_scale: torch.Tensor | float) -> torch.Tensor:
    """NVFP4 values without the global scale (e2m1 * e4m3): what the tensor cores multiply."""
    q = nvfp4.quantize(x.float(), global_scale)
    return nvfp4.dequantize(q.packed, q.scale, 1.0, torch.float32)


def _per_expert(scale: torch.Tensor | float, num_experts: int, name: str) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32)
    if s.dim() == 0:
        return s.expand(num_experts)
    if s.dim() == 1 and s.shape[0] == num_experts:
        return s
    raise ValueError(f"{name}: expected a scalar or shape [{num_experts}], got {list(s.shape)}")


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
    a2 = _per_expert(w2_input_scale, num_experts, "w2_input_scale")
    gs13 = w13_scale_2.float().reshape(num_experts, -1).expand(num_experts, 2)
    out_dtype = hidden_states.dtype
    xq = _unit(hidden_states, a1)  # [T, H]
    acc = torch.zeros(hidden_states.shape, dtype=torch.float32)
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


# ---------------------------------------------------------------------------------------------
# Configs: prefill tiles (W4A4 is for many tokens per expert). block_k 128 = two m16n8k64 FP4 mma steps.

SHIPPED_CONFIGS = (
    GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3),
    GemmConfig(block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3),
    GemmConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
)
KERNELS = ("gemm1", "gemm2")
# Tokens per expert from which "auto" would pick W4A4 on SM12x (unmeasured: to be tuned on an RTX PRO 6000).
MIN_TOKENS_PER_EXPERT = 64


def heuristic_config(tokens_per_expert: float) -> MoeConfig:
    """A shipped config (each AOT-checked for sm_120 in tests/test_w4a4.py)."""
    cfg = SHIPPED_CONFIGS[0] if tokens_per_expert <= 128 else SHIPPED_CONFIGS[2]
    return MoeConfig(gemm1=cfg, gemm2=cfg)


# ---------------------------------------------------------------------------------------------
# Ahead-of-time compile (no GPU): shared bytes and the mma instructions of the PTX, in a worker process.

_POINTERS = {
    "xq_ptr": "*u8", "xs_ptr": "*u8", "hq_ptr": "*u8", "hs_ptr": "*u8", "w_ptr": "*u8", "ws_ptr": "*u8",
    "a1_ptr": "*fp32", "a2_ptr": "*fp32", "wgs_ptr": "*fp32", "topk_weights_ptr": "*fp32",
    "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "y_ptr": "*bf16",
}  # fmt: skip
_NOT_DIVISIBLE = {"num_pairs", "top_k", "gate_row0", "up_row0", "stride_gsg", "stride_gse", "stride_a2e"}


@dataclass(frozen=True)
class AotResult:
    shared: int  # bytes, Triton's metadata.shared
    mma: tuple[str, ...]  # distinct mma instructions in the PTX
    target: str  # the PTX .target line


def _compile(kernel: str, cfg: GemmConfig, arch: int):
    from sglang_glm5.kernels import nvfp4_w4a4 as k
    from sglang_glm5.tiles import compile_for_target

    fn = {"gemm1": k.nvfp4_w4a4_gemm1_kernel, "gemm2": k.nvfp4_w4a4_gemm2_kernel}[kernel]
    consts = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EMULATE_DOT": False}
    if "INTERPRETER" in fn.arg_names:
        consts["INTERPRETER"] = False
    return compile_for_target(fn, consts, cfg, arch, _POINTERS, _NOT_DIVISIBLE)


def aot_compile(jobs: list[tuple[str, GemmConfig, int]]) -> list[AotResult | str]:
    """Compile each (kernel, config, arch) in a fresh process with the interpreter off (kernels defined
    under TRITON_INTERPRET=1 cannot be compiled in-process). A job that fails gives its error line."""
    import os
    import subprocess

    payload = json.dumps([(k, c.as_dict(), a) for k, c, a in jobs])
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm5.w4a4"], input=payload, capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise RuntimeError(f"W4A4 AOT worker failed: {tail}")
    results = json.loads(proc.stdout)
    return [AotResult(r["shared"], tuple(r["mma"]), r["target"]) if isinstance(r, dict) else r for r in results]


def _worker() -> None:
    """python -m sglang_glm5.w4a4: compile the jobs given as JSON on stdin; results as JSON on stdout."""
    import re

    results: list[dict | str] = []
    for kernel, cfg, arch in json.load(sys.stdin):
        try:
            compiled = _compile(kernel, GemmConfig(**cfg), arch)
        except Exception as exc:  # noqa: BLE001 - reported per job: a target without FP4 support may refuse
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            results.append(f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400])
            continue
        ptx = compiled.asm["ptx"]
        target = next((ln.strip() for ln in ptx.splitlines() if ln.startswith(".target")), "")
        mma = sorted(set(re.findall(r"\b((?:wg)?mma[.\w:]*)", ptx)))
        results.append({"shared": int(compiled.metadata.shared), "mma": mma, "target": target})
    json.dump(results, sys.stdout)


# ---------------------------------------------------------------------------------------------
# Launch: the compiled path on SM12x; ``emulate_dot`` (the interpreter tests) swaps dot_scaled out.


def _run(
    hidden_states, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, topk_weights, topk_ids,
    w13_input_scale, w2_input_scale, *, w13_order: str, config: MoeConfig | None, emulate_dot: bool,
) -> torch.Tensor:  # fmt: skip
    import triton

    from sglang_glm5.kernels import nvfp4_w4a4 as k
    from sglang_glm5.moe import _check_ids_in_range, _validate, align_pairs_by_expert, interpreting, sum_over_slots

    num_tokens, hidden, num_experts, inter, top_k = _validate(
        hidden_states, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, topk_weights, topk_ids, w13_order
    )
    device = hidden_states.device
    out = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=device)
    if num_tokens == 0:
        return out
    _check_ids_in_range(topk_ids, num_experts)
    a1 = torch.as_tensor(w13_input_scale, dtype=torch.float32, device=device).max().reshape(1)
    a2 = _per_expert(w2_input_scale, num_experts, "w2_input_scale").to(device).contiguous()
    num_pairs = num_tokens * top_k
    cfg = config or heuristic_config(num_pairs / num_experts)
    interpret = interpreting()
    topk_ids = topk_ids.contiguous()
    gs13 = w13_scale_2.contiguous()
    gate_row0, up_row0 = (0, inter) if w13_order == "gate_up" else (inter, 0)

    xq = torch.empty((num_tokens, hidden // 2), dtype=torch.uint8, device=device)
    xs = torch.empty((num_tokens, hidden // 16), dtype=torch.uint8, device=device)
    block_t, block_k = 16, 256
    k.nvfp4_quantize_kernel[(triton.cdiv(num_tokens, block_t), triton.cdiv(hidden, block_k))](
        x_ptr=hidden_states, global_scale_ptr=a1, xq_ptr=xq, xs_ptr=xs, num_rows=num_tokens, K=hidden,
        stride_xt=hidden_states.stride(0), stride_qt=xq.stride(0), stride_st=xs.stride(0),
        BLOCK_T=block_t, BLOCK_K=block_k,
    )  # fmt: skip

    c1, c2 = cfg.gemm1, cfg.gemm2
    sorted_ids, block_expert = align_pairs_by_expert(topk_ids, num_experts, c1.block_m)
    hq = torch.empty((num_pairs, inter // 2), dtype=torch.uint8, device=device)
    hs = torch.zeros((num_pairs, inter // 16), dtype=torch.uint8, device=device)
    k.nvfp4_w4a4_gemm1_kernel[(block_expert.numel(), triton.cdiv(inter, c1.block_n))](
        xq_ptr=xq, xs_ptr=xs, a1_ptr=a1, w_ptr=w13, ws_ptr=w13_scale.view(torch.uint8), wgs_ptr=gs13, a2_ptr=a2,
        sorted_ids_ptr=sorted_ids, block_expert_ptr=block_expert, hq_ptr=hq, hs_ptr=hs,
        num_pairs=num_pairs, top_k=top_k, inter_size=inter, hidden_size=hidden,
        stride_xqt=xq.stride(0), stride_xst=xs.stride(0), stride_we=w13.stride(0), stride_wn=w13.stride(1),
        stride_se=w13_scale.stride(0), stride_sn=w13_scale.stride(1), stride_gse=gs13.stride(0),
        stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0, stride_a2e=a2.stride(0),
        stride_hqt=hq.stride(0), stride_hst=hs.stride(0), gate_row0=gate_row0, up_row0=up_row0,
        BLOCK_M=c1.block_m, BLOCK_N=c1.block_n, BLOCK_K=c1.block_k, EMULATE_DOT=emulate_dot,
        num_warps=c1.num_warps, num_stages=c1.num_stages,
    )  # fmt: skip

    sorted_ids, block_expert = align_pairs_by_expert(topk_ids, num_experts, c2.block_m)
    y = torch.empty((num_pairs, hidden), dtype=hidden_states.dtype, device=device)
    k.nvfp4_w4a4_gemm2_kernel[(block_expert.numel(), triton.cdiv(hidden, c2.block_n))](
        hq_ptr=hq, hs_ptr=hs, a2_ptr=a2, w_ptr=w2, ws_ptr=w2_scale.view(torch.uint8),
        wgs_ptr=w2_scale_2.contiguous(), topk_weights_ptr=topk_weights.reshape(-1).contiguous(),
        sorted_ids_ptr=sorted_ids, block_expert_ptr=block_expert, y_ptr=y,
        num_pairs=num_pairs, hidden_size=hidden, inter_size=inter,
        stride_hqt=hq.stride(0), stride_hst=hs.stride(0), stride_a2e=a2.stride(0),
        stride_we=w2.stride(0), stride_wn=w2.stride(1), stride_se=w2_scale.stride(0), stride_sn=w2_scale.stride(1),
        stride_yt=y.stride(0), BLOCK_M=c2.block_m, BLOCK_N=c2.block_n, BLOCK_K=c2.block_k,
        EMULATE_DOT=emulate_dot, INTERPRETER=interpret, num_warps=c2.num_warps, num_stages=c2.num_stages,
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
) -> torch.Tensor:
    """W4A4 NVFP4 MoE on SM12x tensor cores; the arguments of ``nvfp4_fused_moe`` plus the input scales.

    w13_input_scale: scalar, [E] or [E, 2] fp32 (its max is the one activation global scale);
    w2_input_scale: scalar or [E] fp32 local-expert scales. Raises RuntimeError off SM12x GPUs: the
    block-scaled FP4 mma exists only there (sm_90 compiles dot_scaled to a bf16 upcast).
    NOT YET RUN ON SM120 HARDWARE.
    """
    device = hidden_states.device if isinstance(hidden_states, torch.Tensor) else None
    if device is None or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 12:
        if device is None or device.type != "cuda":
            got = "no tensor" if device is None else str(device)
        else:
            got = "sm_{}{}".format(*torch.cuda.get_device_capability(device))
        raise RuntimeError(f"nvfp4_fused_moe_w4a4 needs an SM12x (Blackwell workstation) CUDA GPU, got {got}")
    return _run(
        hidden_states, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, topk_weights, topk_ids,
        w13_input_scale, w2_input_scale, w13_order=w13_order, config=config, emulate_dot=False,
    )  # fmt: skip


if __name__ == "__main__":
    _worker()
