"""The W4A16 kernel family: NVFP4 weights decoded in registers, 16-bit activations, any SM80+ GPU.

    P = T * k (token, slot) pairs, E = local experts, H = hidden size, I = intermediate size

What ``variants.KernelVariant`` asks of a family, and the family's launches:

- tiles: the search space, the heuristic (feasible everywhere), the kernels' own rule (block_k >= 64);
- shared memory on a target: ``model_shared_bytes`` (an analytic upper bound, for pruning instantly) and
  ``compiled_shared_bytes`` (Triton's number from an ahead-of-time compile for the target: no GPU needed,
  memoized per Triton version and kernel source); the tests check on samples that the model never calls
  feasible a config the compiler does not;
- the grid of a call (``plan_gemms``: K splits at decode, where few experts are active) and the launches
  of gemm1 and gemm2 (``kernels/nvfp4_moe.py``, their decode ``kernels/nvfp4_decode.py``); ``run`` is the whole
  W4A16 op on checked arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import torch
import triton

from sglang_glm5 import autotune
from sglang_glm5.hardware import GpuTarget, keeps_every_stage, runs_w4a16, wgmma_from_registers
from sglang_glm5.kernels import nvfp4_moe as _k
from sglang_glm5.nvfp4 import LAYOUTS
from sglang_glm5.routing import Route, interpreting, num_blocks_bound, route_pairs, sum_over_slots, uses_pdl
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import MAX_SPLITS, GemmConfig, MoeConfig, compile_for_target, k_splits_cover
from sglang_glm5.variants import Bucket, KernelVariant, w4a16_gluon

KERNELS = ("gemm1", "gemm2")
# Part of every autotune cache key: bump it when the W4A16 kernels change in a way that makes
# configs tuned for the old ones meaningless or unsafe (2: weights as the left operand, inline-PTX
# decode; 3: gemm2 may walk several N tiles per program, which can take 2 KB more shared memory).
KERNEL_REVISION = 3
# `tune`'s default buckets: decode under expert parallelism (fractions: GLM-5 B = 1 .. 16 tokens per
# step), then 1 .. 2048 tokens per expert.
TUNE_BUCKETS = (*(Fraction(1, 2**n) for n in (5, 4, 3, 2, 1)), 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


# ---------------------------------------------------------------------------------------------
# Tiles and their shared memory.


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


def search_space(bucket) -> list[GemmConfig]:
    """Candidate configs for a bucket of tokens per expert; small block_m for decode sizes.

    block_n is the weight rows per program, the tensor cores' M: 64 per 4 warps (one Hopper
    warpgroup), so 8 warps only with block_n 128, and from 64 tokens per expert up 256 on 8 warps (EP8 gemm2
    128x256x64-w8-s3 was 7% faster than the best 128-row tile at 256 tokens per expert, bench/README.md run 24).
    From the H200 sweep (bench/h200/sweep_r2.log):
    block_k 512 never won and 2 stages rarely did with every expert busy. Below one token per expert
    (decode: few experts active, split K, a few K steps per program) 2 stages are candidates too: at
    GLM-5 TP8 m=1/32, 16x64x256-w4-s2 came within 2% of the winning gemm1 tile (bench/h200/runs/run15_*).
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
# without the block loop (the only forms ``launch_gemm2`` runs it in). The split forms are compiled with
# 2 splits (the number of splits changes the unrolled reduction, held in registers, not the shared memory), with
# the block loop and with a program per possible block (``plan_launch``), the latter with the block axis
# last (the grid's order changes no shared memory); gemm2 also as two halves (``halves``), for the configs that may
# take them. The forms a decode step may run with per-block ready counters (``awaits_blocks``, ``overlaps_tail``) are
# compiled with them: the counters add a word of shared memory at most (the same bytes for GLM-5's decode tiles on sm_90
# and sm_120, Triton 3.8 AOT) and the code of the plain form. The unsplit forms are compiled in one grid order: the
# block axis last (``overlaps_tail``) gave the same shared memory with and without the block loop (16x64x256-w4-s3
# gemm1, 16x128x256-w4-s3 gemm2, sm_90 and sm_120, Triton 3.8 AOT).
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
        {"MULTI_TILE": False, "SPLITS": 2, "BLOCK_LOOP": True, "HALVES": True},  # only where ``halves`` allows it
    ),
}


def _compile(kernel: str, cfg: GemmConfig, arch: int, form: dict[str, bool] | None = None):
    consts = {
        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": True, "INTERPRETER": False,
        # the layout a layer takes on this arch (weights.kernel_layout; the same shared memory in every layout)
        "LAYOUT": LAYOUTS.index("kernel_wgmma" if wgmma_from_registers(arch) else "kernel"),
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


def _compiled_shared(kernel: str, cfg: GemmConfig, arch: int) -> int:
    """Shared memory of the kernel as it may run: the largest over its ``FORMS``."""
    # the halves' form for the tiles that can take it, whatever GEMM2_HALVES says now (the sizes are memoized); the
    # stream-K form for a config that asks for it (tests/test_tiles.py: it takes the tile's shared memory)
    forms = [f for f in FORMS[kernel]
             if (not f.get("HALVES") or _halvable(cfg)) and (cfg.stream or not f.get("STREAM"))]  # fmt: skip
    if cfg.one_k_step:  # the one form it runs in (``launch_gemm2`` refuses any other), with and without the block loop
        check_config(cfg, kernel)  # gemm2 only
        forms = [form for f in forms if f.get("ONE_K_STEP") for form in (f, {**f, "BLOCK_LOOP": True})]
    shared = max(int(_compile(kernel, cfg, arch, form).metadata.shared) for form in forms)
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
    return f"triton={triton.__version__}|src={digest}|{kernel}|sm_{arch}|{cfg.label}"


def aot_job(kernel: str, cfg: dict, arch: int, want_asm: bool = False) -> int | dict[str, str]:
    """One ahead-of-time compile (``sglang_glm5.aot`` worker): shared bytes over the kernel's forms, or its PTX."""
    config = GemmConfig(**cfg)
    if want_asm:
        return {"ptx": _compile(kernel, config, arch).asm["ptx"]}
    return _compiled_shared(kernel, config, arch)


def _compile_jobs(jobs: list[tuple[str, GemmConfig, int]], want_asm: bool = False) -> list:
    from sglang_glm5.aot import run_jobs

    results = run_jobs("sglang_glm5.variants.w4a16:aot_job", [[k, c.as_dict(), a, want_asm] for k, c, a in jobs])
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


# ---------------------------------------------------------------------------------------------
# How many programs: at decode a rank sees few active experts (GLM-5 sends a token to 8 of 256), so
# the programs of the active blocks alone cannot fill the GPU; the K loop is then split.


# Up to WHOLE_GRID_PAIRS_PER_EXPERT, a GEMM launch takes a program per possible routing block when their number is at
# most this many times the blocks expected (``plan_launch``). H200, GLM-5 EP8 (bench/README.md, run 24): the whole grid
# measured 0.92-0.98x at B = 8-16 (bound / expected 2.9-4.6) and 1.04-1.12x at B = 1-6 (5.8-8.6), the block axis last
# in both; TP8's decode grids were whole already. At B = 128-256 (run 25) it keeps gemm2's halves at 147 registers.
WHOLE_GRID_WITHIN = 5.0
# gemm2 computes a 4-warp N tile of 128 rows or more as two halves, one after the other, when it walks one tile per
# program (``halves``): the decoded weights of one half in registers at a time (sm_90 AOT, Triton 3.8:
# 16x128x256-w4-s3 147 registers a thread against 228, 3 programs per SM instead of 2). H200, GLM-5 EP8, with the
# whole grid up to 8 pairs per expert: B = 128 0.98x, B = 256 0.96x, B = 16 0.99x the op (bench/README.md, run 25).
GEMM2_HALVES = True
# ``WHOLE_GRID_WITHIN`` applies up to this many pairs per expert of the routing (GLM-5: B <= 256 tokens), the sizes
# where it was measured; above, the block loop.
WHOLE_GRID_PAIRS_PER_EXPERT = 8
# Programs per SM a launch aims for: below it the K loop is split (if it has steps to split).
PROGRAMS_PER_SM = 2
# Programs per SM under which gemm2 halves its N tiles per program (``plan_gemms``), where I takes few K steps (GLM-5
# TP8, I = 256). H200, TP8 at real routing (bench/README.md, run 37): aiming at 5 per SM instead of 2 takes B = 2-3 to
# two tiles a program and B = 4-6 to four (from four or eight): the op 0.975, 0.994, 0.960, 0.993, 0.975x at B = 2-6,
# the same bits; B >= 8 keep eight tiles a program and B = 1 (its cached tile two K steps deep) one (3 per SM: 0.972x at
# B = 3, 1.001x at B = 2 and 5). Not measured on SM120, whose 188 SMs reach the aim with fewer tiles a program.
MULTI_TILE_PROGRAMS_PER_SM = 5
# Programs per SM the tuner also tries for the split plan below one token per expert (``split_candidates``; a
# config stores the winner as ``programs_per_sm``): 1 measured 5-7% faster than 2 at GLM-5 B = 8-16 with the cached
# tiles (bench/README.md, run 21), and 4 lets a tile of half the registers (block_k 128) keep more warps in flight.
SPLIT_TRIALS = (1, 4)
# The targets ``tune --splits-only`` tries at a decode step beside the default (PROGRAMS_PER_SM): each that gives the
# step a split count of its own is timed, and the step's entry keeps the fastest (bench/README.md, run 23).
STEP_SPLIT_TRIALS = (1, 3, 4, 6, 8)
# The op's launches that use programmatic dependent launch where it runs (``routing.uses_pdl``), below one token
# per expert (GLM-5: B < 32), where it measured 2-9% faster; with busy experts it measured 1-4% slower
# (bench/README.md, run 20) unless gemm2 fills gemm1's last wave (``TAIL_OVERLAP_MAX_TOKENS_PER_EXPERT``).
PDL_LAUNCHES = ("route", "gemm1", "gemm2", "sum")
PDL_BELOW_TOKENS_PER_EXPERT = 1  # those launches use PDL below this many tokens per expert of the routing
# Below this many tokens per expert (with PDL), where gemm2 walks several N tiles a program, gemm2's programs wait
# for their routing block's h alone, counted by gemm1 in per-block ready counters, not for the whole of gemm1
# (``awaits_blocks``). H200, GLM-5 at real routing, two seeds (bench/README.md, run 40): TP8 B = 2-16 (2-8 tiles a
# program) 0.952-0.995x the op, B = 8 1.00x; where gemm2 runs one tile a program (EP8, TP8 B = 1) 1.00-1.04x, so not
# there. Asking the L2 for gemm2's weights before the wait, or napping between reads, did not help.
AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT = 1
# From one token per expert up to this many (GLM-5: B = 32-256, where gemm1 runs four to six waves of programs),
# gemm2's programs fill gemm1's last wave (``overlaps_tail``): every launch with PDL, gemm2's programs waiting for their
# routing block's h alone (the ready counters), and both GEMMs' grids with the block axis last, so that a block's N
# tiles run side by side and its h is whole early, not in gemm1's last wave. H200, GLM-5 at real routing, seeds 43 /
# 67, against the launches one after another on the same inputs, the same bits (bench/README.md, run 44): EP8 B = 32,
# 64, 128, 256 0.975 / 0.969, 1.001 / 0.976, 0.987 / 0.980, 0.996 / 0.980x the op; TP8 0.951 / 0.946, 0.988 / 0.984,
# 0.991 / 1.007, 1.001 / 0.998x. PDL alone there 0.985-1.026x; the counters with the blocks first 0.986-1.043x; the
# blocks last alone 0.979-1.015x.
TAIL_OVERLAP_MAX_TOKENS_PER_EXPERT = 8
# Up to this many pairs (T * k, at most E), the routing launch gives each valid pair a block of its own in one program
# instead of sorting them in E + 1 (``routing.route_pairs(each_pair=True)``); the same outputs.
EACH_PAIR_MAX_PAIRS = 16
# A gemm1 config with ``stream`` (programs per SM) runs as a stream-K schedule (``Launch.stream``) up to this many pairs
# per expert of the routing (GLM-5: B <= 256), the sizes where it was measured; above, the planned grid.
STREAM_PAIRS_PER_EXPERT = 8
# The stream-K programs per SM the tuner tries for gemm1 below one token per expert (``split_candidates``; a config
# stores the winner as ``stream``). H200, GLM-5 (bench/README.md, run 28): 2 per SM 0.94-0.95x the op at EP8 B = 16
# (16x128x256 tiles, of which 2 stay resident per SM), 3 per SM 0.93x at EP8 B = 4 (16x64x128, 3 resident); 2-40%
# slower at the other sizes measured.
STREAM_TRIALS = (2, 3)
# The Gluon kernels (``w4a16_gluon``) are tuner candidates up to this many tokens per expert (GLM-5 B <= 256): in the
# H200 tune of run 31 the 2-stage Gluon gemm1 won the buckets of B = 128 and 256 too (0.94x and 0.98x the 16x128x256
# Triton tile at EP8, 0.96-0.97x at TP8; bench/README.md); above it the tuner times the leading Triton gemm1 tile in
# Gluon instead (``w4a16_gluon.prefill_forms``, run 34).
GLUON_MAX_BUCKET = 8


@functools.cache
def sm_count(device_index: int | None) -> int:
    """SMs of a CUDA device; 8 for the interpreter (a small GPU, so that tests exercise split-K)."""
    if device_index is None:
        return 8
    from sglang_glm5.hardware import detect

    return detect(device_index).sm_count


def expected_blocks(num_pairs: int, num_experts: int, num_global_experts: int, block_m: int) -> float:
    """Routing blocks a call is expected to use, with the pairs spread uniformly over all experts:
    the local experts that receive a pair, plus the blocks their pairs fill."""
    local_pairs = num_pairs * num_experts / num_global_experts
    active = num_experts * (1.0 - (1.0 - 1.0 / num_global_experts) ** num_pairs)
    return active + local_pairs / block_m


@dataclass(frozen=True)
class Launch:
    """Grid of one GEMM: block programs (each walks the used blocks b, b + programs, ...) and K splits; or, for gemm1,
    a stream-K schedule of ``stream`` persistent programs (``kernels/nvfp4_moe.py``)."""

    block_programs: int
    splits: int
    k_per_split: int  # K elements per split, a multiple of block_k
    blocks_last: bool = False  # grid (N programs, K splits, block programs): the used blocks' programs launch first
    stream: int = 0  # > 0: gemm1 as a stream-K schedule of this many programs (block_programs, splits unused)


def plan_launch(
    k_size: int, cfg: GemmConfig, n_programs: int, blocks_bound: int, blocks_expected: float, sms: int,
    split: bool = True, whole_grid_within: float = 0.0,
) -> Launch:  # fmt: skip
    """The grid of one GEMM. K splits (if ``split``): ``cfg.split_k`` when set, else as many as it takes
    for the expected blocks times ``n_programs`` (N tiles or tile groups) to make ``cfg.programs_per_sm``
    (PROGRAMS_PER_SM when 0) per SM.

    Block programs: twice the expected blocks (and two more), at most the bound, so that a skewed
    routing costs a second pass of a few programs rather than a launch sized for the worst case. But when
    the bound is at most ``whole_grid_within`` times the expected blocks, a program per possible block (no
    block loop, which costs the GEMMs 40-80 registers a thread), the block axis last in the grid of a split
    launch, so that the idle programs launch after the working ones (``WHOLE_GRID_WITHIN``).
    """
    work = max(1.0, blocks_expected) * n_programs
    want = (cfg.split_k or math.ceil((cfg.programs_per_sm or PROGRAMS_PER_SM) * sms / work)) if split else 1
    programs = min(blocks_bound, math.ceil(2 * blocks_expected) + 2)
    splits, per_split = k_splits(k_size, cfg.block_k, want)
    if programs < blocks_bound <= whole_grid_within * max(1.0, blocks_expected):
        return Launch(blocks_bound, splits, per_split, blocks_last=splits > 1)
    return Launch(programs, splits, per_split)


class GemmPlan(NamedTuple):
    gemm1: Launch
    gemm2: Launch
    per_program: int  # gemm2's N tiles per program
    counters: int  # int32 counters gemm1 needs (0 without a split or a stream-K schedule)


def plan_gemms(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int, sms: int
) -> GemmPlan:
    """The grids of both GEMMs of one call, from sizes known on the host (no sync)."""

    def blocks(gemm: GemmConfig) -> tuple[int, float]:
        bound = num_blocks_bound(num_pairs, num_experts, gemm.block_m)
        return bound, min(bound, expected_blocks(num_pairs, num_experts, num_global_experts, gemm.block_m))

    blocks1, blocks2 = blocks(cfg.gemm1), blocks(cfg.gemm2)
    tiles1 = triton.cdiv(inter, cfg.gemm1.block_n)
    within = WHOLE_GRID_WITHIN if num_pairs <= WHOLE_GRID_PAIRS_PER_EXPERT * num_global_experts else 0.0
    launch1 = plan_launch(hidden, cfg.gemm1, tiles1, *blocks1, sms, whole_grid_within=within)
    steps = triton.cdiv(hidden, cfg.gemm1.block_k)
    stream = cfg.gemm1.stream * sms
    if (
        stream
        and num_pairs <= STREAM_PAIRS_PER_EXPERT * num_global_experts
        and _stream_fits(stream, blocks1[0] * tiles1 * steps)
    ):
        launch1 = Launch(blocks1[0], 1, steps * cfg.gemm1.block_k, stream=stream)  # else the planned grid
    tiles2 = triton.cdiv(hidden, cfg.gemm2.block_n)
    per_program = gemm2_tiles_per_program(inter, cfg.gemm2)
    least = 2 if cfg.gemm2.one_k_step else 1  # a one-step tile runs only with several N tiles a program
    while per_program > least and blocks2[1] * triton.cdiv(tiles2, per_program) < MULTI_TILE_PROGRAMS_PER_SM * sms:
        per_program //= 2  # few blocks: keep the programs that fill the GPU
    launch2 = plan_launch(inter, cfg.gemm2, triton.cdiv(tiles2, per_program), *blocks2, sms, split=per_program == 1,
                          whole_grid_within=within)  # fmt: skip
    counters = blocks1[0] * tiles1 if launch1.splits > 1 or launch1.stream else 0
    return GemmPlan(launch1, launch2, per_program, counters)


def awaits_blocks(cfg: MoeConfig, plan: GemmPlan, num_pairs: int, num_global_experts: int, dependent: bool) -> bool:
    """Whether gemm2's programs wait for their routing block's h alone (per-block ready counters that gemm1 fills)
    rather than for the whole of gemm1: below ``AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT``, where gemm2 is a ``dependent``
    launch (PDL; or the interpreter, which runs the same kernels in order) walking several N tiles a program (a few
    programs a block, each with a long chain to start), both GEMMs on one routing (the same block_m) and gemm1 on a
    planned grid (not stream-K)."""
    return (
        dependent
        and num_pairs < AWAIT_BLOCKS_BELOW_TOKENS_PER_EXPERT * num_global_experts
        and plan.per_program > 1
        and cfg.gemm1.block_m == cfg.gemm2.block_m
        and not plan.gemm1.stream
    )


def overlaps_tail(cfg: MoeConfig, plan: GemmPlan, num_pairs: int, num_global_experts: int, dependent: bool) -> bool:
    """Whether gemm2's programs fill gemm1's last wave (``TAIL_OVERLAP_MAX_TOKENS_PER_EXPERT``): from one token per
    expert up to that many, where gemm2 is a ``dependent`` launch (PDL; or the interpreter, which runs the same kernels
    in order), both GEMMs on one routing (the same block_m), unsplit, and gemm1 on a planned grid (not stream-K). The
    op then launches with PDL, both grids with the block axis last, and gemm2 waiting for each block's ready counter."""
    return (
        dependent
        and num_global_experts <= num_pairs <= TAIL_OVERLAP_MAX_TOKENS_PER_EXPERT * num_global_experts
        and cfg.gemm1.block_m == cfg.gemm2.block_m
        and plan.gemm1.splits == 1
        and plan.gemm2.splits == 1
        and not plan.gemm1.stream
    )


def in_tail_order(plan: GemmPlan) -> GemmPlan:
    """``plan`` with both grids' block axis last, as the op runs it where ``overlaps_tail`` (and the tuner times it)."""
    return plan._replace(gemm1=dataclasses.replace(plan.gemm1, blocks_last=True),
                         gemm2=dataclasses.replace(plan.gemm2, blocks_last=True))  # fmt: skip


def _stream_fits(programs: int, units: int) -> bool:
    """Whether a stream-K schedule of ``programs`` over at most ``units`` work units (blocks x N tiles x K steps)
    keeps the kernel's int32 unit arithmetic (program x units) in range."""
    return programs * units < 2**31


# gemm2 tiles in their one-K-step form (``GemmConfig.one_k_step``), which the tuner times beside its leading tiles
# above ONE_STEP_ABOVE_BUCKET tokens per expert (as search_space's 256-deep 8-warp tiles) where I is one step of them
# and H makes two N tiles or more:
# routing blocks of 128 pairs, as gemm1's chunked-prefill tiles (so one routing serves both GEMMs), which the forms
# that loop over K do not fit on sm_90 at 3 stages. H200, GLM-5 TP8 B = 8192 (bench/README.md, runs 35-36): gemm2
# 128x128x256-w8-s3 746 us and one routing (76 us) against 794 us and two routings (105 us) with 64x256x256-w8-s3;
# the tuner's pick, 128x128x256-w8-s4-1k (gemm2 0.949 against 0.999 ms), made the op 0.958x.
ONE_STEP_TILES = tuple(GemmConfig(128, n, 256, num_warps=8, num_stages=s, one_k_step=True) for n, s in
                       ((128, 3), (128, 4), (256, 3)))  # fmt: skip
ONE_STEP_ABOVE_BUCKET = 64


def split_candidates(
    kernel: str, cfg: GemmConfig, shape: MoeShape, bucket: Bucket, sms: int, targets: tuple[int, ...] = SPLIT_TRIALS,
    arch: int | None = None,
) -> list[GemmConfig]:  # fmt: skip
    """``cfg`` with other plans for its grid, for the tuner to time beside the default plan.

    Below one token per expert, other targets for its K split plan (``GemmConfig.programs_per_sm``: ``targets``):
    those that give the bucket's step (``MoeShape.tokens_at``) another split count than the default does, one per
    count. A target, not a fixed count, so that every step of the bucket gets the split its own blocks call for.
    For a Triton gemm1, also the stream-K schedule at each of STREAM_TRIALS programs per SM (``GemmConfig.stream``).
    None of these when ``cfg`` fixes its split, target or schedule already, at busy buckets, and for a gemm2 that
    walks several N tiles per program (it does not split).

    For gemm2 above ONE_STEP_ABOVE_BUCKET, ONE_STEP_TILES where I fits their one K step.

    On ``sm_{arch}`` where the Gluon kernels run (``w4a16_gluon.runs_on``), up to GLUON_MAX_BUCKET: also their tiles
    (``w4a16_gluon.TILES``) with the default plan and, below one token per expert where the GEMM splits, with each
    other split count ``targets`` give and unsplit; above it (chunked prefill), ``cfg`` itself in Gluon
    (``w4a16_gluon.prefill_forms``).
    """
    num_pairs = shape.tokens_at(bucket) * shape.top_k

    def splits(c: GemmConfig) -> int | None:
        plan = plan_gemms(MoeConfig(c, c), num_pairs, shape.num_experts, shape.all_experts, shape.hidden,
                          shape.inter, sms)  # fmt: skip
        if kernel == "gemm1":
            return plan.gemm1.splits
        return plan.gemm2.splits if plan.per_program == 1 else None

    def other_plans(tile: GemmConfig, seen: set) -> list[GemmConfig]:
        """Each target's plan with a split count not in ``seen``, and for a Gluon tile unsplit too."""
        trials = [dataclasses.replace(tile, programs_per_sm=t) for t in targets]
        if tile.gluon:
            trials.append(dataclasses.replace(tile, split_k=1))
        out = []
        for trial in trials:
            if (n := splits(trial)) not in seen:
                seen.add(n)
                out.append(trial)
        return out

    out = []
    if bucket < 1 and not cfg.has_plan and (seen := {splits(cfg)}) != {None}:
        out = other_plans(cfg, seen)
        if kernel == "gemm1" and not cfg.gluon:
            out += [dataclasses.replace(cfg, stream=n) for n in STREAM_TRIALS]
    if kernel == "gemm2" and bucket > ONE_STEP_ABOVE_BUCKET and not cfg.has_plan:
        out += [t for t in ONE_STEP_TILES if one_k_step_runs(t, shape.hidden, shape.inter) and t != cfg]
    if arch is None or not w4a16_gluon.runs_on(arch):
        return out
    if bucket > GLUON_MAX_BUCKET:
        return out + w4a16_gluon.prefill_forms(kernel, cfg)
    for tile in w4a16_gluon.TILES[kernel]:
        if cfg.without_plan() != tile:
            out.append(tile)
            if bucket < 1 and (n := splits(tile)) is not None:
                out += other_plans(tile, {n})
    return out


def k_splits(k_size: int, block_k: int, want: int) -> tuple[int, int]:
    """(splits, K elements per split) for at most ``want`` splits (and MAX_SPLITS) of whole K steps, none empty."""
    steps = triton.cdiv(k_size, block_k)
    per_split = triton.cdiv(steps, max(1, min(steps, want, MAX_SPLITS)))
    return triton.cdiv(steps, per_split), per_split * block_k


def _check_launch(launch: Launch, cfg: GemmConfig, k_size: int) -> None:
    if not k_splits_cover(k_size, cfg.block_k, launch.splits, launch.k_per_split):
        raise ValueError(f"launch: {launch} leaves a K split empty or cuts a K step (K = {k_size}, {cfg.label})")


def _whole_grid(route: Route, cfg: GemmConfig, k_size: int) -> Launch:
    """One block program per possible block, no split: the grid of a launch that was not planned."""
    return Launch(route.block_expert.numel(), 1, triton.cdiv(k_size, cfg.block_k) * cfg.block_k)


def _grid(launch: Launch, n_programs: int) -> tuple[int, int, int]:
    """(block programs, N programs, K splits), or with ``launch.blocks_last`` (N programs, K splits, block programs)."""
    if launch.blocks_last:
        return n_programs, launch.splits, launch.block_programs
    return launch.block_programs, n_programs, launch.splits


def launch_gemm1(
    x, w13, w13_scale, gs13, route: Route, h, cfg: GemmConfig, top_k, gate_row0, up_row0, interpret,
    *, launch: Launch | None = None, counters: torch.Tensor | None = None, layout: str = "checkpoint",
    pdl: bool = False, ready: torch.Tensor | None = None,
):  # fmt: skip
    """gemm1 into h [P, I]. ``launch`` (default: a program per possible block, no split) with splits > 1 or a
    stream-K schedule needs ``counters``: int32, at least num_blocks * N tiles, zeroed (``route_pairs(zero=...)``).
    ``layout``: that of w13 and its scales (``nvfp4.LAYOUTS``). ``pdl``: programmatic dependent launch
    (``routing.uses_pdl``). ``ready``: int32 [num_blocks], zeroed: each block's stored N tiles are counted there, for
    a gemm2 launched with the same tensor (``launch_gemm2``; not with a stream-K schedule). A config marked ``gluon``
    runs the Gluon kernel where ``w4a16_gluon.applies`` (a program per possible block, the launch's splits), else
    this one. Returns the fp32 scratch the launch writes (split or stream-K partials), or None: a caller whose next
    launch may run beside this one (``ready``) keeps it alive until then, so that the allocator does not hand its
    memory to that launch while this one still uses it."""
    num_pairs, inter = h.shape
    check_config(cfg, "gemm1")
    launch = launch or _whole_grid(route, cfg, x.shape[1])
    _check_launch(launch, cfg, x.shape[1])
    _check_ready(ready, route)
    if ready is not None and launch.stream:
        raise ValueError("ready: per-block ready counters need a planned grid, got a stream-K schedule")
    if w4a16_gluon.applies(h.device, layout, x.shape[1], cfg, x.dtype):
        # an unsplit launch's blocks-last order carries over; otherwise the Gluon launch's own rule (its split form
        # has not run in that order on a GPU)
        order = True if launch.blocks_last and launch.splits == 1 else None
        return w4a16_gluon.launch(x, w13, w13_scale, gs13, route, h, top_k, gate_row0, up_row0, splits=launch.splits,
                                  k_per_split=launch.k_per_split, counters=counters, pdl=pdl, tile=cfg,
                                  blocks_last=order, ready=ready)  # fmt: skip
    tiles = triton.cdiv(inter, cfg.block_n)
    split = launch.splits > 1
    part = None
    if split or launch.stream:
        if counters is None or counters.numel() < route.block_expert.numel() * tiles:
            raise ValueError(f"counters: this gemm1 launch needs {route.block_expert.numel() * tiles} zeroed int32")
    if split:
        part = torch.empty((launch.splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device)
    if launch.stream:
        units = route.block_expert.numel() * tiles * triton.cdiv(x.shape[1], cfg.block_k)
        if not _stream_fits(launch.stream, units):
            raise ValueError(f"launch: {launch.stream} stream programs over {units} units overflow int32")
        # two partial tiles (gate and up) per program for its first and its last segment (kernels/nvfp4_moe.py)
        part = torch.empty(launch.stream * 2 * 2 * cfg.block_n * cfg.block_m, dtype=torch.float32, device=h.device)
    w13 = w13.view(torch.int16)  # 4 nibbles per element (kernels/nvfp4_decode.py)
    grid = (launch.stream, 1, 1) if launch.stream else _grid(launch, tiles)
    _k.nvfp4_moe_gemm1_kernel[grid](
        x_ptr=x,
        w_ptr=w13,
        ws_ptr=w13_scale.view(torch.uint8),
        wgs_ptr=gs13,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        part_ptr=h if part is None else part,
        counter_ptr=route.used_blocks if counters is None else counters,
        ready_ptr=route.used_blocks if ready is None else ready,
        h_ptr=h,
        num_pairs=num_pairs,
        top_k=top_k,
        inter_size=inter,
        hidden_size=x.shape[1],
        k_per_split=launch.k_per_split,
        stride_xt=x.stride(0),
        stride_we=w13.stride(0),
        stride_wn=w13.stride(1),
        stride_se=w13_scale.stride(0),
        stride_sn=w13_scale.stride(1),
        stride_gse=gs13.stride(0),
        stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0,
        stride_ht=h.stride(0),
        gate_row0=gate_row0,
        up_row0=up_row0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=x.shape[1] % cfg.block_k == 0,
        SPLITS=launch.splits,
        BLOCK_LOOP=not launch.stream and launch.block_programs < route.block_expert.numel(),
        LAYOUT=LAYOUTS.index(layout),
        INTERPRETER=interpret,
        PDL=pdl,
        BLOCKS_LAST=launch.blocks_last,
        STREAM=launch.stream > 0,
        READY=ready is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )
    return part


def _check_ready(ready: torch.Tensor | None, route: Route) -> None:
    if ready is not None and (ready.dtype != torch.int32 or ready.numel() != route.block_expert.numel()):
        raise ValueError(f"ready: expected {route.block_expert.numel()} int32 counters (one a routing block), got "
                         f"{ready.numel()} {ready.dtype}")  # fmt: skip


def gemm2_tiles_per_program(inter: int, cfg: GemmConfig) -> int:
    """N tiles per gemm2 program: as many as fit in 8 K steps (one when a tile alone takes 5 or more).

    Measured on the H200 (bench/h200/runs/exp_flat_loop*.json): with I = 256 (GLM-5 TP8: one or two
    K steps) 4-8 tiles per program made gemm2 5-29% faster; with I = 2048 (EP8: 8-32 steps) one tile
    per program was 1-9% faster than several.
    """
    return max(1, 8 // triton.cdiv(inter, cfg.block_k))


def _halvable(cfg: GemmConfig) -> bool:
    """Whether a gemm2 tile can run as two halves: 4 warps (one warp group: each half keeps 64 rows a wgmma) and
    at least 128 rows."""
    return cfg.num_warps == 4 and cfg.block_n >= 128


def halves(cfg: GemmConfig, per_program: int) -> bool:
    """Whether gemm2 computes each N tile as two halves (``GEMM2_HALVES``): one tile per program, a tile that can."""
    return GEMM2_HALVES and per_program == 1 and _halvable(cfg)


def launch_gemm2(
    h, w2, w2_scale, gs2, topk_weights_flat, route: Route, y, cfg: GemmConfig, interpret,
    per_program=None, *, launch: Launch | None = None, layout: str = "checkpoint", pdl: bool = False,
    ready: torch.Tensor | None = None, ready_tiles: int = 0,
):  # fmt: skip
    """gemm2 into y: [P, H] in the hidden states' dtype, or with ``launch.splits`` > 1 the fp32
    partials [splits, P, H] that ``sum_over_slots`` adds. ``per_program``: N tiles per program (>= 1);
    None = ``gemm2_tiles_per_program``; several tiles per program and a split K exclude each other. ``pdl`` as
    ``launch_gemm1``. ``ready``: the counters gemm1 filled on the same routing (``launch_gemm1``): a program waits
    until its block's reaches ``ready_tiles`` (gemm1's N tiles) rather than for the whole of gemm1 (with ``pdl``,
    while gemm1 still runs). A config marked ``gluon`` runs the Gluon kernel where ``w4a16_gluon.applies`` (a program
    per possible block, the launch's splits and N tiles per program), else this one."""
    hidden = y.shape[-1]
    num_pairs = h.shape[0]
    check_config(cfg, "gemm2", (w2.shape[0], hidden, h.shape[1]))
    w2 = w2.view(torch.int16)
    tiles = triton.cdiv(hidden, cfg.block_n)
    if per_program is None:
        per_program = gemm2_tiles_per_program(h.shape[1], cfg)
    elif per_program < 1:
        raise ValueError(f"per_program: expected N tiles per program >= 1, got {per_program}")
    per_program = min(per_program, tiles)
    launch = launch or _whole_grid(route, cfg, h.shape[1])
    _check_launch(launch, cfg, h.shape[1])
    split = launch.splits > 1
    if split and per_program > 1:
        raise ValueError(f"launch: a split K ({launch.splits}) needs one N tile per program, got {per_program}")
    if cfg.one_k_step and per_program < 2:  # its shape was checked above
        raise ValueError(f"config: {cfg.label} runs gemm2 with K in one step and several N tiles a program, got "
                         f"{per_program} of {tiles} a program")  # fmt: skip
    want = (launch.splits, num_pairs, hidden) if split else (num_pairs, hidden)
    if tuple(y.shape) != want or (split and y.dtype != torch.float32):
        raise ValueError(f"y: expected shape {list(want)}{' fp32' if split else ''}, got {list(y.shape)} {y.dtype}")
    _check_ready(ready, route)
    if ready is not None and ready_tiles < 1:
        raise ValueError(f"ready_tiles: expected gemm1's N tiles a block (>= 1), got {ready_tiles}")
    if w4a16_gluon.applies(h.device, layout, h.shape[1], cfg, h.dtype):
        if ready is not None:
            raise ValueError(f"ready: the Gluon gemm2 ({cfg.label}) waits for the whole of gemm1")
        w4a16_gluon.launch_gemm2(h, w2, w2_scale, gs2, topk_weights_flat, route, y, splits=launch.splits,
                                 k_per_split=launch.k_per_split, per_program=per_program, pdl=pdl,
                                 tile=cfg)  # fmt: skip
        return
    groups = triton.cdiv(tiles, per_program)
    grid = _grid(launch, groups)
    _k.nvfp4_moe_gemm2_kernel[grid](
        h_ptr=h,
        w_ptr=w2,
        ws_ptr=w2_scale.view(torch.uint8),
        wgs_ptr=gs2,
        topk_weights_ptr=topk_weights_flat,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        ready_ptr=route.used_blocks if ready is None else ready,
        y_ptr=y,
        num_pairs=num_pairs,
        hidden_size=hidden,
        inter_size=h.shape[1],
        k_per_split=launch.k_per_split,
        ready_tiles=ready_tiles,
        stride_ht=h.stride(0),
        stride_we=w2.stride(0),
        stride_wn=w2.stride(1),
        stride_se=w2_scale.stride(0),
        stride_sn=w2_scale.stride(1),
        stride_yt=y.stride(-2),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=h.shape[1] % cfg.block_k == 0,
        MULTI_TILE=per_program > 1,
        ONE_K_STEP=per_program > 1 and h.shape[1] <= cfg.block_k,
        HALVES=halves(cfg, per_program),
        SPLITS=launch.splits,
        BLOCK_LOOP=launch.block_programs < route.block_expert.numel(),
        LAYOUT=LAYOUTS.index(layout),
        INTERPRETER=interpret,
        PDL=pdl,
        BLOCKS_LAST=launch.blocks_last,
        READY=ready is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )


def run(hidden_states, weights, topk_weights, topk_ids, *, out, config: MoeConfig | None, num_global_experts=None):
    """The W4A16 op on arguments ``moe.fused_moe`` validated (T > 0, ids in range), into ``out``: the routing
    launch (sort, activation layout, split-K counters), gemm1 and gemm2 (in Gluon for a config marked so, where it
    runs) and the top-k sum."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = weights.shape
    num_pairs = num_tokens * top_k
    num_global = num_global_experts or num_experts
    device = hidden_states.device
    interpret = interpreting()
    cfg = config or autotune.pick_config("w4a16", num_pairs / num_global, num_experts, hidden, inter, device)
    sms = sm_count(None if interpret else (device.index if device.index is not None else torch.cuda.current_device()))

    plan = plan_gemms(cfg, num_pairs, num_experts, num_global, hidden, inter, sms)
    may_pdl = uses_pdl(device)
    gluon2 = w4a16_gluon.applies(device, weights.layout, inter, cfg.gemm2, hidden_states.dtype)
    tail = not gluon2 and overlaps_tail(cfg, plan, num_pairs, num_global, may_pdl or interpret)
    if tail:  # a block's N tiles side by side in both GEMMs
        plan = in_tail_order(plan)
    launch1, launch2, per_program = plan.gemm1, plan.gemm2, plan.per_program
    pdl = dict.fromkeys(PDL_LAUNCHES, may_pdl and (num_pairs < PDL_BELOW_TOKENS_PER_EXPERT * num_global or tail))
    awaits = tail or (not gluon2 and awaits_blocks(cfg, plan, num_pairs, num_global, pdl["gemm2"] or interpret))
    n_ready = num_blocks_bound(num_pairs, num_experts, cfg.gemm1.block_m) if awaits else 0
    n_counters = plan.counters
    counters = torch.empty(n_counters + n_ready, dtype=torch.int32, device=device) if n_counters + n_ready else None
    ready = counters[n_counters:] if awaits else None  # zeroed with the split counters by the routing launch
    xp = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=device)  # x in the GEMMs' K order
    each_pair = num_pairs <= min(EACH_PAIR_MAX_PAIRS, num_experts)
    route1 = route_pairs(topk_ids, num_experts, cfg.gemm1.block_m, zero=counters, permute=(hidden_states, xp),
                         pdl=pdl.get("route", False), layout=weights.layout, each_pair=each_pair)  # fmt: skip
    route2 = route1
    if cfg.gemm2.block_m != cfg.gemm1.block_m:
        route2 = route_pairs(topk_ids, num_experts, cfg.gemm2.block_m, pdl=pdl.get("route", False),
                             each_pair=each_pair)  # fmt: skip

    h = torch.empty((num_pairs, inter), dtype=hidden_states.dtype, device=device)
    gate_row0, up_row0 = weights.gate_up_rows
    # gemm1's scratch stays referenced until the op returns: with ready counters gemm2 runs beside gemm1 and must not
    # get its memory for y (the launches after the op wait for gemm2's end, which waits for gemm1's)
    part1 = launch_gemm1(xp, weights.w13, weights.w13_scale, weights.w13_scale_2, route1, h, cfg.gemm1, top_k,
                         gate_row0, up_row0, interpret, launch=launch1, counters=counters, layout=weights.layout,
                         pdl=pdl.get("gemm1", False), ready=ready)  # fmt: skip
    if launch2.splits > 1:
        y = torch.empty((launch2.splits, num_pairs, hidden), dtype=torch.float32, device=device)
    else:
        y = torch.empty((num_pairs, hidden), dtype=hidden_states.dtype, device=device)
    launch_gemm2(h, weights.w2, weights.w2_scale, weights.w2_scale_2, topk_weights.reshape(-1).contiguous(),
                 route2, y, cfg.gemm2, interpret, per_program=per_program, launch=launch2,
                 layout=weights.layout, pdl=pdl.get("gemm2", False), ready=ready,
                 ready_tiles=triton.cdiv(inter, cfg.gemm1.block_n))  # fmt: skip
    sum_over_slots(y, topk_ids, out, num_experts, interpret, pdl=pdl.get("sum", False))
    del part1
    return out


VARIANT = KernelVariant(
    name="w4a16",
    title="W4A16",
    requires="an SM80+ GPU",
    runs_on=runs_w4a16,
    kernels=KERNELS,
    revision=KERNEL_REVISION,
    tune_buckets=TUNE_BUCKETS,
    decode_buckets=True,
    heuristic=heuristic_config,
    search_space=search_space,
    model_shared_bytes=model_shared_bytes,
    shared_floor=model_shared_floor,
    compiled_shared_bytes=compiled_shared_bytes_many,
    check_config=check_config,
    split_candidates=split_candidates,
    step_split_targets=STEP_SPLIT_TRIALS,
    kernel_bencher="sglang_glm5.bench:kernel_bencher",
    selfcheck="sglang_glm5.cli:selfcheck_command",
)
