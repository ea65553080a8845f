"""The W4A4 kernel family: activations quantized to NVFP4, block-scaled FP4 tensor cores (SM12x only).

What ``variants.KernelVariant`` asks of a family, and its launches: the shipped tiles and heuristic, the
search space, the shared-memory model (checked against Triton's AOT numbers in tests/test_w4a4.py), the
ahead-of-time compile (shared bytes and the PTX's mma instructions, no GPU), the activation quantizer
and the two GEMM launches (``kernels/nvfp4_w4a4.py``). The op on top of them, its CPU emulation and the
measured thresholds are ``sglang_glm5.w4a4``; the benchers and what ``tune`` does after storing the tiles
are ``sglang_glm5.w4a4_tune``. NOT YET RUN ON SM120 HARDWARE.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from sglang_glm5._ints import cdiv
from sglang_glm5.hardware import runs_w4a4
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import KernelVariant

TUNE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)  # tokens per expert; W4A4 is for prefill


# ---------------------------------------------------------------------------------------------
# Configs: prefill tiles (W4A4 is for many tokens per expert). block_k 128 = two m16n8k64 FP4 mma steps.

SHIPPED_CONFIGS = (
    GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3),
    GemmConfig(block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3),
    GemmConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
)
KERNELS = ("gemm1", "gemm2")
KERNEL_REVISION = 1  # in the W4A4 cache keys: raise it when a kernel change makes tuned tiles stale


def heuristic_config(tokens_per_expert: float) -> MoeConfig:
    """A shipped config (each AOT-checked for sm_120 in tests/test_w4a4.py)."""
    cfg = SHIPPED_CONFIGS[0] if tokens_per_expert <= 128 else SHIPPED_CONFIGS[2]
    return MoeConfig(gemm1=cfg, gemm2=cfg)


def search_space(bucket: int) -> list[GemmConfig]:
    """W4A4 candidates: prefill tiles; block_k 128 or 256 = two or four m16n8k64 FP4 mma steps."""
    block_ms = (32, 64) if bucket <= 64 else (64, 128)
    return [
        GemmConfig(bm, bn, bk, warps, stages)
        for bm, bn, bk, stages, warps in itertools.product(block_ms, (64, 128), (128, 256), (2, 3, 4), (4, 8))
    ]


def model_shared_bytes(kernel: str, cfg: GemmConfig) -> int:
    """Upper bound on the shared memory of a W4A4 GEMM on sm_120 (mma.sync: num_stages - 1 buffers).

    Per buffer: the packed activation tile (BM x BK/2) and its scales (BM x BK/16), and per weight matrix
    (gate and up in gemm1) BN x BK/2 + BN x BK/16. Checked against Triton 3.8's AOT numbers in
    tests/test_w4a4.py (e.g. gemm1 128x128x256, 3 stages: model 110592 B, compiled 100352 B).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    weights = 2 if kernel == "gemm1" else 1
    per_row = cfg.block_k // 2 + cfg.block_k // 16
    return max(cfg.num_stages - 1, 1) * (cfg.block_m + weights * cfg.block_n) * per_row


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
    """Compile each (kernel, config, arch) ahead of time (``sglang_glm5.aot`` workers, the interpreter off).
    A job that fails gives its error line."""
    from sglang_glm5.aot import run_jobs

    results = run_jobs("sglang_glm5.variants.w4a4:aot_job", [[k, c.as_dict(), a] for k, c, a in jobs])
    return [AotResult(r["shared"], tuple(r["mma"]), r["target"]) if isinstance(r, dict) else r for r in results]


def compiled_shared_bytes_many(items: list[tuple[str, GemmConfig]], arch: int) -> list[int | str]:
    """Shared bytes of each (kernel, config) compiled for sm_{arch}, or the compile's error line.

    Sizes are memoized in $SGLANG_GLM5_CACHE_DIR/aot_shared.json (the W4A16 tuner's file, keys prefixed "w4a4|") per
    Triton version and kernel source; the missing ones compile together.
    """
    import triton

    from sglang_glm5.aot import memoized, source_digest

    digest = source_digest("sglang_glm5.kernels.nvfp4_w4a4")  # with the prologue and decode helpers it imports
    keys = [f"w4a4|triton={triton.__version__}|src={digest}|{k}|sm_{arch}|{c.label}" for k, c in items]

    def compile_missing(indices: list[int]) -> list[int | str]:
        fresh = aot_compile([(items[i][0], items[i][1], arch) for i in indices])
        return [r.shared if isinstance(r, AotResult) else r for r in fresh]  # errors: returned, not memoized

    return memoized(keys, compile_missing)


def aot_job(kernel: str, cfg: dict, arch: int) -> dict:
    """One ahead-of-time compile (``sglang_glm5.aot`` worker): shared bytes, the PTX's mma instructions and target."""
    import re

    compiled = _compile(kernel, GemmConfig(**cfg), arch)
    ptx = compiled.asm["ptx"]
    target = next((ln.strip() for ln in ptx.splitlines() if ln.startswith(".target")), "")
    mma = sorted(set(re.findall(r"\b((?:wg)?mma[.\w:]*)", ptx)))
    return {"shared": int(compiled.metadata.shared), "mma": mma, "target": target}


# ---------------------------------------------------------------------------------------------
# Launch: the compiled path on SM12x; ``emulate_dot`` (the interpreter tests) swaps dot_scaled out.


def quantize_activations(x: torch.Tensor, a1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (packed [T, H/2] uint8, e4m3 scales [T, H/16] uint8) with the global scale a1 [1] fp32."""
    from sglang_glm5.kernels import nvfp4_w4a4 as k

    num_tokens, hidden = x.shape
    xq = torch.empty((num_tokens, hidden // 2), dtype=torch.uint8, device=x.device)
    xs = torch.empty((num_tokens, hidden // 16), dtype=torch.uint8, device=x.device)
    block_t, block_k = 16, 256
    k.nvfp4_quantize_kernel[(cdiv(num_tokens, block_t), cdiv(hidden, block_k))](
        x_ptr=x, global_scale_ptr=a1, xq_ptr=xq, xs_ptr=xs, num_rows=num_tokens, K=hidden,
        stride_xt=x.stride(0), stride_qt=xq.stride(0), stride_st=xs.stride(0), BLOCK_T=block_t, BLOCK_K=block_k,
    )  # fmt: skip
    return xq, xs


def launch_gemm1(xq, xs, a1, w13, w13_scale, gs13, a2, route, hq, hs, cfg: GemmConfig, top_k: int,
                 gate_row0: int, up_row0: int, emulate_dot: bool) -> None:  # fmt: skip
    from sglang_glm5.kernels import nvfp4_w4a4 as k

    sorted_ids, block_expert = route
    num_pairs, inter = hq.shape[0], hq.shape[1] * 2
    k.nvfp4_w4a4_gemm1_kernel[(block_expert.numel(), cdiv(inter, cfg.block_n))](
        xq_ptr=xq, xs_ptr=xs, a1_ptr=a1, w_ptr=w13, ws_ptr=w13_scale.view(torch.uint8), wgs_ptr=gs13, a2_ptr=a2,
        sorted_ids_ptr=sorted_ids, block_expert_ptr=block_expert, hq_ptr=hq, hs_ptr=hs,
        num_pairs=num_pairs, top_k=top_k, inter_size=inter, hidden_size=xq.shape[1] * 2,
        stride_xqt=xq.stride(0), stride_xst=xs.stride(0), stride_we=w13.stride(0), stride_wn=w13.stride(1),
        stride_se=w13_scale.stride(0), stride_sn=w13_scale.stride(1), stride_gse=gs13.stride(0),
        stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0, stride_a2e=a2.stride(0),
        stride_hqt=hq.stride(0), stride_hst=hs.stride(0), gate_row0=gate_row0, up_row0=up_row0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EMULATE_DOT=emulate_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def launch_gemm2(hq, hs, a2, w2, w2_scale, gs2, topk_weights_flat, route, y, cfg: GemmConfig,
                 emulate_dot: bool, interpret: bool) -> None:  # fmt: skip
    from sglang_glm5.kernels import nvfp4_w4a4 as k

    sorted_ids, block_expert = route
    num_pairs, hidden = y.shape
    k.nvfp4_w4a4_gemm2_kernel[(block_expert.numel(), cdiv(hidden, cfg.block_n))](
        hq_ptr=hq, hs_ptr=hs, a2_ptr=a2, w_ptr=w2, ws_ptr=w2_scale.view(torch.uint8), wgs_ptr=gs2,
        topk_weights_ptr=topk_weights_flat, sorted_ids_ptr=sorted_ids, block_expert_ptr=block_expert, y_ptr=y,
        num_pairs=num_pairs, hidden_size=hidden, inter_size=hq.shape[1] * 2,
        stride_hqt=hq.stride(0), stride_hst=hs.stride(0), stride_a2e=a2.stride(0),
        stride_we=w2.stride(0), stride_wn=w2.stride(1), stride_se=w2_scale.stride(0), stride_sn=w2_scale.stride(1),
        stride_yt=y.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EMULATE_DOT=emulate_dot, INTERPRETER=interpret, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


VARIANT = KernelVariant(
    name="w4a4",
    title="W4A4",
    requires="an SM12x GPU (RTX PRO 6000, RTX 50xx)",
    runs_on=runs_w4a4,
    kernels=KERNELS,
    revision=KERNEL_REVISION,
    key_prefix="w4a4_",
    tune_buckets=TUNE_BUCKETS,
    heuristic=heuristic_config,
    search_space=search_space,
    model_shared_bytes=lambda kernel, cfg, target: model_shared_bytes(kernel, cfg),
    compiled_shared_bytes=lambda items, target: compiled_shared_bytes_many(items, target.arch),
    kernel_bencher="sglang_glm5.w4a4_tune:kernel_bencher",
    after_tune="sglang_glm5.w4a4_tune:after_tune",
    selfcheck="sglang_glm5.w4a4_verify:selfcheck_command",
)
