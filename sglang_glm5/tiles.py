"""Tile configs of the NVFP4 MoE kernels, their shared memory on a target GPU, and the default heuristic.

Shared memory decides whether a config launches at all: SM120 gives a block 101376 B, Hopper 232448 B.
Two answers, both without a GPU:

- ``model_shared_bytes``: an analytic upper bound, for pruning large search spaces instantly;
- ``compiled_shared_bytes``: Triton's own number, from compiling the kernel ahead of time for the
  target (``metadata.shared``; oversized configs still compile, the limit is checked only at launch),
  memoized on disk per Triton version and kernel source.

The tests check on samples that the model never calls feasible a config the compiler does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_glm5.hardware import GpuTarget, keeps_every_stage

KERNELS = ("gemm1", "gemm2")
# Part of every autotune cache key: bump it when the W4A16 kernels change in a way that makes
# configs tuned for the old ones meaningless or unsafe (2: weights as the left operand, inline-PTX
# decode; 3: gemm2 may walk several N tiles per program, which can take 2 KB more shared memory).
KERNEL_REVISION = 3
# K splits a GEMM may use at decode (the last program of a gemm1 tile adds them, unrolled).
MAX_SPLITS = 32


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one MoE GEMM kernel."""

    block_m: int  # (token, slot) pairs per program; all share one expert
    block_n: int  # output columns per program (weight rows: the tensor cores' M in the W4A16 kernels)
    block_k: int  # reduction step, in unpacked elements (a multiple of 32)
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 0  # K splits: 0 = as many as the call needs to fill the GPU (moe.plan_launch), else this many

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {v}")
        if self.block_k < 32:
            raise ValueError(f"GemmConfig.block_k must be >= 32 (the W4A16 kernels need >= 64), got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"GemmConfig.num_stages must be in 1..8, got {self.num_stages}")
        if not 0 <= self.split_k <= MAX_SPLITS:
            raise ValueError(f"GemmConfig.split_k must be in 0..{MAX_SPLITS} (0 = chosen per call), got {self.split_k}")

    @property
    def label(self) -> str:
        split = f"-k{self.split_k}" if self.split_k else ""
        return f"{self.block_m}x{self.block_n}x{self.block_k}-w{self.num_warps}-s{self.num_stages}{split}"

    def as_dict(self) -> dict[str, int]:
        d = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "block_k": self.block_k,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }
        if self.split_k:
            d["split_k"] = self.split_k
        return d


@dataclass(frozen=True)
class MoeConfig:
    """One config per GEMM; each GEMM sorts the pairs into blocks of its own block_m."""

    gemm1: GemmConfig
    gemm2: GemmConfig


def check_w4a16_config(cfg: GemmConfig) -> None:
    """Raise ValueError when the W4A16 kernels cannot run ``cfg``: they split block_k into four
    quarter-width dots of at least 16 (kernels/nvfp4_moe.py), so block_k >= 64."""
    if cfg.block_k < 64:
        raise ValueError(f"config: block_k must be >= 64 (four quarter-width dots of >= 16), got {cfg.label}")


def heuristic_config(tokens_per_expert: float) -> MoeConfig:
    """A config that is correct everywhere and small enough for any target's shared memory.

    From a sweep of 24-34 configs per size on one H200 (bench/h200/sweep_r2.log): at decode sizes
    block_k 128 with 3 stages won, at 256 and 2048 tokens per expert 64 x 128 x 64. Larger tiles that
    won at m=64 (64 x 128 x 256) are left to the tuner: they do not fit SM120's 101376 B. Every config
    here does (compiled ahead of time for sm_120 in tests/test_tiles.py).
    """
    if tokens_per_expert < 1:  # fewer tokens than experts: few experts active, split K (H200 real routing)
        cfg = GemmConfig(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=3)
    elif tokens_per_expert <= 16:
        cfg = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)
    elif tokens_per_expert <= 128:
        cfg = GemmConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3)
    else:
        cfg = GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)
    return MoeConfig(gemm1=cfg, gemm2=cfg)


def _stage_bytes(kernel: str, cfg: GemmConfig) -> int:
    """Operand bytes of one pipeline stage: the 16-bit activation tile and, per weight matrix (gate and up
    in gemm1), the packed bytes and the e4m3 scales."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    weights = 2 if kernel == "gemm1" else 1
    return 2 * cfg.block_m * cfg.block_k + weights * (cfg.block_n * cfg.block_k // 2 + cfg.block_n * cfg.block_k // 16)


def model_shared_bytes(kernel: str, cfg: GemmConfig, target: GpuTarget) -> int:
    """Upper bound on the shared memory of one MoE GEMM kernel.

    Per pipeline stage: the 16-bit activation tile (BM x BK x 2) and, per weight matrix (gate and up
    in gemm1), packed bytes BN x BK / 2 plus scales BN x BK / 16, times the pipeline buffers
    (``hardware.keeps_every_stage``: num_stages on wgmma/TMA parts, num_stages - 1 on the mma.sync
    parts). On top: the decoded fp16 weight tile (BN x BK x 2) and an fp32-sized output tile
    (BM x BN x 2), either of which may be staged through shared memory for a layout change.
    """
    buffers = cfg.num_stages if keeps_every_stage(target.arch) else max(cfg.num_stages - 1, 1)
    return buffers * _stage_bytes(kernel, cfg) + 2 * cfg.block_n * cfg.block_k + 2 * cfg.block_m * cfg.block_n


def model_shared_floor(kernel: str, cfg: GemmConfig) -> int:
    """A lower bound on the same: the operand buffers of at least num_stages - 1 pipeline stages.

    Configs between this floor and ``model_shared_bytes`` may or may not fit; the tuner asks the
    compiler about them instead of discarding them (on Hopper the upper bound is loose: the decoded
    tile stays in registers there with Triton 3.6, but not with every Triton version).
    """
    return max(cfg.num_stages - 1, 1) * _stage_bytes(kernel, cfg)


def _kernel_fn(kernel: str):
    from sglang_glm5.kernels import nvfp4_moe as k

    return {"gemm1": k.nvfp4_moe_gemm1_kernel, "gemm2": k.nvfp4_moe_gemm2_kernel}[kernel]


# Pointer arguments and their element types; every other non-constexpr argument is an i32.
_POINTERS = {
    "x_ptr": "*bf16", "h_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*i16", "ws_ptr": "*u8", "wgs_ptr": "*fp32",
    "topk_weights_ptr": "*fp32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "used_blocks_ptr": "*i32",
    "part_ptr": "*fp32", "counter_ptr": "*i32",
}  # fmt: skip
# Arguments that are not multiples of 16 in a real launch (the rest are: pointers, sizes, strides).
_NOT_DIVISIBLE = {"num_pairs", "top_k", "gate_row0", "up_row0", "stride_gsg", "stride_gse"}


def compile_for_target(fn, consts: dict, cfg: GemmConfig, arch: int, pointers: dict, not_divisible: set):
    """Triton's ahead-of-time compile of one kernel for ``sm_{arch}`` (no GPU needed).

    ``pointers`` maps pointer arguments to Triton types (the rest are i32); every argument outside
    ``not_divisible`` is declared a multiple of 16, as it is in a real launch on these shapes.
    """
    import triton
    from triton.backends.compiler import GPUTarget as TritonTarget

    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(fn.arg_names)
        if sig[a] != "constexpr" and a not in not_divisible
    }
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(src, target=TritonTarget("cuda", arch, 32), options=options)


# The compile-time forms each kernel may run in, chosen per call by the op (``moe.nvfp4_fused_moe``):
# gemm1 with or without a split K; gemm2 with one N tile per program, several, or a split K. They can
# differ by a few KB of shared memory; a config must fit all. The split forms are compiled with 2 splits
# (the number of splits changes the unrolled reduction, held in registers, not the shared memory) and
# with the block loop (a split is planned when few blocks are expected, so it comes with the loop).
FORMS = {
    "gemm1": ({"SPLITS": 1, "BLOCK_LOOP": False}, {"SPLITS": 2, "BLOCK_LOOP": True}),
    "gemm2": (
        {"MULTI_TILE": False, "SPLITS": 1, "BLOCK_LOOP": False},
        {"MULTI_TILE": True, "SPLITS": 1, "BLOCK_LOOP": False},
        {"MULTI_TILE": False, "SPLITS": 2, "BLOCK_LOOP": True},
    ),
}


def _compile(kernel: str, cfg: GemmConfig, arch: int, form: dict[str, bool] | None = None):
    consts = {
        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": True, "INTERPRETER": False,
    }  # fmt: skip
    consts.update(form or FORMS[kernel][0])
    return compile_for_target(_kernel_fn(kernel), consts, cfg, arch, _POINTERS, _NOT_DIVISIBLE)


def _compiled_shared(kernel: str, cfg: GemmConfig, arch: int) -> int:
    """Shared memory of the kernel as it may run: the largest over its ``FORMS``."""
    return max(int(_compile(kernel, cfg, arch, form).metadata.shared) for form in FORMS[kernel])


def _memo_key(kernel: str, cfg: GemmConfig, arch: int) -> str:
    import triton

    from sglang_glm5.aot import source_digest

    digest = source_digest("sglang_glm5.kernels.nvfp4_moe")
    return f"triton={triton.__version__}|src={digest}|{kernel}|sm_{arch}|{cfg.label}"


def aot_job(kernel: str, cfg: dict, arch: int, want_asm: bool = False) -> int | dict[str, str]:
    """One ahead-of-time compile (``sglang_glm5.aot`` worker): shared bytes over the kernel's forms, or its PTX."""
    config = GemmConfig(**cfg)
    if want_asm:
        return {"ptx": _compile(kernel, config, arch).asm["ptx"]}
    return _compiled_shared(kernel, config, arch)


def _compile_jobs(jobs: list[tuple[str, GemmConfig, int]], want_asm: bool = False) -> list:
    from sglang_glm5.aot import run_jobs

    results = run_jobs("sglang_glm5.tiles:aot_job", [[k, c.as_dict(), a, want_asm] for k, c, a in jobs])
    failed = [(k, c.label, a, r) for (k, c, a), r in zip(jobs, results, strict=True) if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"ahead-of-time compile failed for {failed}")
    return results


def compiled_shared_bytes_many(
    items: list[tuple[str, GemmConfig]], target: GpuTarget, *, memo: bool = True
) -> list[int]:
    """Shared memory of each (kernel, config) compiled ahead of time for the target's architecture.

    No GPU needed. Results are memoized on disk ($SGLANG_GLM5_CACHE_DIR/aot_shared.json) per Triton
    version and kernel source; the missing ones compile together in worker processes.
    """
    keys = [_memo_key(kernel, cfg, target.arch) for kernel, cfg in items]

    from sglang_glm5.aot import memoized

    def compile_missing(indices: list[int]) -> list[int]:
        return [int(v) for v in _compile_jobs([(items[i][0], items[i][1], target.arch) for i in indices])]

    return [int(v) for v in memoized(keys, compile_missing, memo=memo)]


def compiled_shared_bytes(kernel: str, cfg: GemmConfig, target: GpuTarget, *, memo: bool = True) -> int:
    """Shared memory of one kernel compiled ahead of time for the target (see compiled_shared_bytes_many)."""
    return compiled_shared_bytes_many([(kernel, cfg)], target, memo=memo)[0]


def compiled_asm(kernel: str, cfg: GemmConfig, target: GpuTarget) -> dict[str, str]:
    """The kernel's PTX (key "ptx") for the target, for instruction checks."""
    return _compile_jobs([(kernel, cfg, target.arch)], want_asm=True)[0]
