"""W4A16 tiles: the kernels' rule for a config, the heuristic and search space, and a config's shared memory on a
target: ``model_shared_bytes`` (an analytic upper bound, for pruning instantly) and ``compiled_shared_bytes``
(Triton's number from an ahead-of-time compile for the target: no GPU needed, memoized per Triton version and kernel
source); the tests check on samples that the model never calls feasible a config the compiler does not.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

from sglang_glm5.hardware import GpuTarget, keeps_every_stage, wgmma_from_registers
from sglang_glm5.nvfp4 import LAYOUTS
from sglang_glm5.tiles import GemmConfig, MoeConfig, compile_for_target
from sglang_glm5.variants import DECODE_REFUSED, KernelVariant, w4a16_gluon, w4a16_pairs

KERNELS = ("gemm1", "gemm2")


def check_config(cfg: GemmConfig, kernel: str | None = None, enk: tuple[int, int, int] | None = None) -> None:
    """Raise ValueError when the W4A16 kernels cannot run ``cfg``: they split block_k into four
    quarter-width dots of at least 16 (kernels/nvfp4_decode.py), so block_k >= 64. Given the GEMM (``kernel`` and its
    (E, N, K)), also a one-K-step tile where it cannot run so: gemm1, K deeper than block_k, or one N tile (it
    takes several a program)."""
    if cfg.block_k < 64:
        raise ValueError(f"config: block_k must be >= 64 (four quarter-width dots of >= 16), got {cfg.label}")
    if not cfg.one_k_step or kernel is None:
        return
    if kernel != "gemm2":
        raise ValueError(f"config: {cfg.label} is a one-K-step gemm2 tile, got it for {kernel}")
    if enk is not None and not one_k_step_runs(cfg, enk[1], enk[2]):
        raise ValueError(f"config: {cfg.label} is a gemm2 tile for K <= {cfg.block_k} and N > {cfg.block_n}, got "
                         f"N = {enk[1]}, K = {enk[2]}")  # fmt: skip


def one_k_step_runs(cfg: GemmConfig, n: int, k: int) -> bool:
    """Whether gemm2 of N = ``n`` (H) and K = ``k`` (I) can run ``cfg`` in its one-K-step form: K within one step and
    two N tiles or more (it takes several a program)."""
    return k <= cfg.block_k and n > cfg.block_n


# Tokens per expert at which the decode check (``launchable_tiles``) takes the heuristic's tiles: every rule it has
# (decode splits, 1 to 16 tokens, the busy and the prefill tiles).
HEURISTIC_CHECK_BUCKETS = (1 / 32, 1, 16, 32, 64, 128, 4096)


def launchable_tiles(
    entries: Iterable[tuple[str, GemmConfig]], variant: KernelVariant, heuristic_buckets=HEURISTIC_CHECK_BUCKETS
) -> list[tuple[str, GemmConfig]]:
    """The Triton GEMM tiles the op may launch from cache ``entries`` ((kernel field, config): the field of each
    entry's key, ``autotune.key_kernel_field``) of the W4A16 ``variant``'s current revision (the fields its
    ``key_kernel`` writes), and the heuristic's at ``heuristic_buckets``: what
    the decode check (``w4a16_pairs``, through ``compiled_shared_bytes_many``) has to pass. Each in its plain Triton
    form: the Gluon marks and the split plans change no Triton form, and the Gluon kernels lay out their own decode.
    Distinct and sorted."""
    key_kernels = {variant.key_kernel(k): k for k in KERNELS}
    plain = dict(gluon=False, producer=False, gate_then_up=False, programs_per_sm=0, split_k=0)
    tiles = {(key_kernels[field], dataclasses.replace(cfg, **plain)) for field, cfg in entries if field in key_kernels}
    tiles |= {(k, getattr(heuristic_config(m), k)) for m in heuristic_buckets for k in KERNELS}
    return sorted(tiles, key=str)


def heuristic_config(tokens_per_expert: float) -> MoeConfig:
    """A config that is correct everywhere and small enough for any target's shared memory.

    Up to 8 tokens per expert (GLM-5 decode up to B = 256) 256-deep K steps: the tuner's pick at every such bucket on
    the H200 and the H100, and the whole op at GLM-5 B = 32-256 with 16 x 64 x 256 (3 stages) in both GEMMs took
    0.73-0.91x its time with 16 x 64 x 128 on the H200 at real routing (2 stages: 0.83-0.98x).
    On an SM120 the 3-stage gemm1 tile holds one program an SM by shared memory (100 KB an SM), so an offline pick
    (``w4a16_plan.resident_aim``) and the shipped rtx-pro-6000 entries take the 2-stage one there. Above that, from a
    sweep of 24-34 configs per size on one H200 (balanced routing, earlier kernels): block_k
    128 with 3 stages, at 256 and 2048 tokens per expert 64 x 128 x 64. Larger tiles that won at m=64 (64 x 128 x
    256) are left to the tuner: they do not fit SM120's 101376 B. Every config here does (compiled ahead of time for
    sm_120 in tests/test_tiles.py).
    """
    if tokens_per_expert <= 8:  # few experts active (split K below 1) or a few tokens each
        cfg = GemmConfig(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=3)
    elif tokens_per_expert <= 16:
        cfg = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)
    elif tokens_per_expert <= 128:
        cfg = GemmConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3)
    else:
        cfg = GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)
    return MoeConfig(gemm1=cfg, gemm2=cfg)


def search_space(bucket) -> list[GemmConfig]:
    """Candidate configs for a bucket of tokens per expert; small block_m for decode sizes.

    block_n is the weight rows per program, the tensor cores' M: 64 per 4 warps (one Hopper
    warpgroup), so 8 warps only with block_n 128, and from 64 tokens per expert up 256 on 8 warps (EP8 gemm2
    128x256x64-w8-s3 was 7% faster than the best 128-row tile at 256 tokens per expert). From an H200 sweep:
    block_k 512 never won and 2 stages rarely did with every expert busy. Below one token per expert
    (decode: few experts active, split K, a few K steps per program) 2 stages are candidates too: at
    GLM-5 TP8 m=1/32, 16x64x256-w4-s2 came within 2% of the winning gemm1 tile.
    """
    if bucket < 1:
        space = itertools.product((16,), (64, 128), (128, 256), (2, 3, 4), (4, 8))
    elif bucket <= 16:
        space = itertools.product((16,), (64, 128), (128, 256), (3, 4), (4, 8))
    elif bucket <= 64:
        space = itertools.product((16, 32, 64), (64, 128), (128, 256), (3, 4), (4, 8))
    else:  # and 256-deep 8-warp tiles: a K of 256 (GLM-5 TP8's gemm2) is then one step, its activations loaded once
        space = itertools.chain(itertools.product((64, 128), (64, 128, 256), (64, 128), (3, 4), (4, 8)),
                                itertools.product((64, 128), (128, 256), (256,), (2, 3), (8,)))  # fmt: skip
    fits = {4: (64, 128), 8: (128, 256)}  # weight rows per program for each warp count
    return [GemmConfig(bm, bn, bk, w, st) for bm, bn, bk, st, w in space if bn in fits[w]]


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
    activations = 2 * cfg.block_m * cfg.block_k  # a one-K-step tile loads them once, the weights in stages around it
    weights = _stage_bytes(kernel, cfg) - activations
    extra = 2 * cfg.block_n * cfg.block_k + 2 * cfg.block_m * cfg.block_n
    return (1 if cfg.one_k_step else buffers) * activations + buffers * weights + extra


def model_shared_floor(kernel: str, cfg: GemmConfig) -> int:
    """A lower bound on the same: the operand buffers of at least num_stages - 1 pipeline stages.

    Configs between this floor and ``model_shared_bytes`` may or may not fit; the tuner asks the
    compiler about them instead of discarding them (on Hopper the upper bound is loose: the decoded
    tile stays in registers there with Triton 3.6, but not with every Triton version).
    """
    return max(cfg.num_stages - 1, 1) * _stage_bytes(kernel, cfg)


def halvable(cfg: GemmConfig) -> bool:
    """Whether a gemm2 tile can run as two halves: 4 warps (one warp group: each half keeps 64 rows a wgmma), at
    least 128 rows, and K steps of at least 128: a half of 64 rows in steps of 64 decodes, on sm_90 (Triton 3.8), in a
    layout whose registers pair words of two scale blocks of the kernel_wgmma layout (``w4a16_pairs``)."""
    return cfg.num_warps == 4 and cfg.block_n >= 128 and cfg.block_k >= 128


# ---------------------------------------------------------------------------------------------
# Ahead-of-time compiles (no GPU).


def _kernel_fn(kernel: str):
    from sglang_glm5.kernels import nvfp4_moe as k

    return {"gemm1": k.nvfp4_moe_gemm1_kernel, "gemm2": k.nvfp4_moe_gemm2_kernel}[kernel]


# Pointer arguments and their element types; every other non-constexpr argument is an i32.
_POINTERS = {
    "x_ptr": "*bf16", "h_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*i16", "ws_ptr": "*u8", "wgs_ptr": "*fp32",
    "topk_weights_ptr": "*fp32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "used_blocks_ptr": "*i32",
    "part_ptr": "*fp32", "counter_ptr": "*i32", "ready_ptr": "*i32",
}  # fmt: skip
# Arguments that are not multiples of 16 in a real launch (the rest are: pointers, sizes, strides).
_NOT_DIVISIBLE = {"num_pairs", "top_k", "gate_row0", "up_row0", "stride_gsg", "stride_gse", "ready_tiles"}


# The compile-time forms each kernel may run in, chosen per call by the op (``moe.nvfp4_fused_moe``):
# gemm1 with or without a split K, or as a stream-K schedule; gemm2 with one N tile per program, several, or a
# split K, or several N tiles on activations loaded once where K is one step. They can differ by a few KB of shared
# memory; a config must fit all, but a one-K-step tile (``GemmConfig.one_k_step``) only the one-step form, with and
# without the block loop (the only forms ``w4a16.launch_gemm2`` runs it in). The split forms are compiled with
# 2 splits (the number of splits changes the unrolled reduction, held in registers, not the shared memory), with
# the block loop and with a program per possible block (``w4a16_plan.plan_launch``), the latter with the block axis
# last (the grid's order changes no shared memory); gemm2 also as two halves (``w4a16_plan.halves``), for the
# configs that may take them. The forms a decode step may run with per-block ready counters
# (``w4a16_plan.awaits_blocks``, ``w4a16_plan.overlaps_tail``) are compiled with them: the counters add a word of
# shared memory at most (the same bytes for GLM-5's decode tiles on sm_90 and sm_120, Triton 3.8 AOT) and the code of
# the plain form. The unsplit forms are compiled in one grid order: the block axis last (``w4a16_plan.overlaps_tail``)
# gave the same shared memory with and without the block loop (16x64x256-w4-s3 gemm1, 16x128x256-w4-s3 gemm2, sm_90
# and sm_120, Triton 3.8 AOT).
FORMS = {
    "gemm1": (
        {"SPLITS": 1, "BLOCK_LOOP": False, "READY": True},
        {"SPLITS": 2, "BLOCK_LOOP": True, "READY": True},
        {"SPLITS": 2, "BLOCK_LOOP": False, "BLOCKS_LAST": True, "READY": True},
        {"SPLITS": 1, "BLOCK_LOOP": False, "STREAM": True},
    ),
    "gemm2": (
        {"MULTI_TILE": False, "SPLITS": 1, "BLOCK_LOOP": False, "READY": True},
        {"MULTI_TILE": True, "SPLITS": 1, "BLOCK_LOOP": False, "READY": True},
        {"MULTI_TILE": True, "ONE_K_STEP": True, "SPLITS": 1, "BLOCK_LOOP": False, "READY": True},  # I <= block_k
        {"MULTI_TILE": False, "SPLITS": 2, "BLOCK_LOOP": True, "READY": True},
        {"MULTI_TILE": False, "SPLITS": 2, "BLOCK_LOOP": False, "BLOCKS_LAST": True, "READY": True},
        {"MULTI_TILE": False, "SPLITS": 2, "BLOCK_LOOP": True, "HALVES": True},  # where w4a16_plan.halves allows
    ),
}


def _layout_on(arch: int) -> int:
    """The index (nvfp4.LAYOUTS) of the kernel layout a layer's weights take on ``sm_{arch}``."""
    return LAYOUTS.index("kernel_wgmma" if wgmma_from_registers(arch) else "kernel")


def _compile(kernel: str, cfg: GemmConfig, arch: int, form: dict[str, bool] | None = None):
    consts = {
        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": True, "INTERPRETER": False,
        # the layout a layer takes on this arch (weights.kernel_layout; the same shared memory in every layout)
        "LAYOUT": _layout_on(arch),
        "PDL": False,  # two instructions, no shared memory
        "BLOCKS_LAST": False,  # the grid's order (set by the forms that use it)
        "READY": False,  # per-block ready counters (a form may set it)
    }  # fmt: skip
    if kernel == "gemm2":
        consts["HALVES"] = False  # the same shared memory as one tile (a form may set it)
        consts["ONE_K_STEP"] = False  # several tiles on activations loaded once (a form sets it)
    else:
        consts["STREAM"] = False  # the stream-K schedule (a form sets it)
    consts.update(form or FORMS[kernel][0])
    return compile_for_target(_kernel_fn(kernel), consts, cfg, arch, _POINTERS, _NOT_DIVISIBLE)


def _compiled_shared(kernel: str, cfg: GemmConfig, arch: int) -> int | str:
    """Shared memory of the kernel as it may run: the largest over its ``FORMS``; or, where a form's decode would
    take two words of one register from two scale blocks (``w4a16_pairs``), why the tile cannot run ("decode: ...")."""
    # the halves' form for the tiles that can take it (a launch may also run them whole: ``w4a16.launch_gemm2``); the
    # stream-K form for a config that asks for it (tests/test_tiles.py: it takes the tile's shared memory)
    forms = [f for f in FORMS[kernel]
             if (not f.get("HALVES") or halvable(cfg)) and (cfg.stream or not f.get("STREAM"))]  # fmt: skip
    if cfg.one_k_step:  # the one form it runs in (w4a16.launch_gemm2 refuses any other), with and without the loop
        check_config(cfg, kernel)  # gemm2 only
        forms = [form for f in forms if f.get("ONE_K_STEP") for form in (f, {**f, "BLOCK_LOOP": True})]
    layout = _layout_on(arch)
    shared = 0
    for form in forms:
        compiled = _compile(kernel, cfg, arch, form)
        wrong = w4a16_pairs.wrong_pairs(compiled.asm["ttgir"], layout)
        if wrong:
            return f"{DECODE_REFUSED}{kernel} {cfg.label} on sm_{arch}, form {form}: {wrong}"
        shared = max(shared, int(compiled.metadata.shared))
    if cfg.gluon and w4a16_gluon.runs_on(arch):  # either kernel may run it (the switch)
        gluon = (w4a16_gluon.aot(arch, splits=n, tile=cfg, kernel=kernel).metadata.shared for n in (1, 2))
        shared = max(shared, *map(int, gluon))
    return shared


def _memo_key(kernel: str, cfg: GemmConfig, arch: int) -> str:
    import triton

    from sglang_glm5.aot import source_digest

    digest = source_digest("sglang_glm5.kernels.nvfp4_moe")
    if cfg.gluon:
        digest += "+" + source_digest("sglang_glm5.kernels.nvfp4_moe_gluon_ws" if cfg.producer else
                                      "sglang_glm5.kernels.nvfp4_moe_gluon")  # fmt: skip
    # sizes are memoized for tiles that pass the decode check: an edit to the check compiles them again
    digest += "+" + source_digest("sglang_glm5.variants.w4a16_pairs")
    return f"triton={triton.__version__}|src={digest}|{kernel}|sm_{arch}|{cfg.label}"


def aot_job(kernel: str, cfg: dict, arch: int, want_asm: bool = False) -> int | str | dict[str, str]:
    """One ahead-of-time compile (``sglang_glm5.aot`` worker): shared bytes over the kernel's forms (or why the
    tile's decode cannot run: ``_compiled_shared``), or its PTX."""
    config = GemmConfig(**cfg)
    if want_asm:
        return {"ptx": _compile(kernel, config, arch).asm["ptx"]}
    return _compiled_shared(kernel, config, arch)


def _compile_jobs(jobs: list[tuple[str, GemmConfig, int]], want_asm: bool = False) -> list:
    from sglang_glm5.aot import run_jobs

    results = run_jobs("sglang_glm5.variants.w4a16_tiles:aot_job", [[k, c.as_dict(), a, want_asm] for k, c, a in jobs])
    failed = [(k, c.label, a, r) for (k, c, a), r in zip(jobs, results, strict=True)
              if isinstance(r, str) and not r.startswith(DECODE_REFUSED)]  # fmt: skip
    if failed:
        raise RuntimeError(f"ahead-of-time compile failed for {failed}")
    return results


def compiled_shared_bytes_many(
    items: list[tuple[str, GemmConfig]], target: GpuTarget, *, memo: bool = True
) -> list[int | str]:
    """Shared memory of each (kernel, config) compiled ahead of time for the target's architecture, or, for a tile
    whose decode would apply a neighbouring block's scale there (``w4a16_pairs``), a string saying so, starting with
    ``variants.DECODE_REFUSED`` (the tuner prunes it under its own count).

    No GPU needed. Sizes are memoized on disk ($SGLANG_GLM5_CACHE_DIR/aot_shared.json) per Triton
    version and kernel source; the missing ones compile together in worker processes.
    """
    keys = [_memo_key(kernel, cfg, target.arch) for kernel, cfg in items]

    from sglang_glm5.aot import memoized

    def compile_missing(indices: list[int]) -> list[int | str]:
        results = _compile_jobs([(items[i][0], items[i][1], target.arch) for i in indices])
        return [v if isinstance(v, str) else int(v) for v in results]

    return memoized(keys, compile_missing, memo=memo)


def compiled_shared_bytes(kernel: str, cfg: GemmConfig, target: GpuTarget, *, memo: bool = True) -> int | str:
    """Shared memory of one kernel compiled ahead of time for the target (see compiled_shared_bytes_many)."""
    return compiled_shared_bytes_many([(kernel, cfg)], target, memo=memo)[0]


def compiled_asm(kernel: str, cfg: GemmConfig, target: GpuTarget) -> dict[str, str]:
    """The kernel's PTX (key "ptx") for the target, for instruction checks."""
    return _compile_jobs([(kernel, cfg, target.arch)], want_asm=True)[0]
