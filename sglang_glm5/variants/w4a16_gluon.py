"""The W4A16 family's GEMMs in Gluon on sm_90: where they run, their candidates for the tuner, their launches.

``kernels/nvfp4_moe_gluon.py`` holds gemm1 and gemm2 as the Triton kernels compute them (same decode, dots and K order,
the op's K splits and deterministic sums) with the copies, the wgmma waits and the scale reads scheduled by hand. A
config marked ``gluon`` (label suffix ``-gl``) runs them where ``applies`` (``w4a16.launch_gemm1`` and ``launch_gemm2``
decide per launch), else the Triton kernels with the same tile and split: the config says what runs, so the tuner, the
cache and the op agree. The tuner offers ``TILES`` with their split plans at decode buckets on a GPU where they run
(``runs_on``), beside the Triton tiles, and at chunked-prefill buckets its leading Triton gemm1 tile in Gluon
(``prefill_forms``). On the H200 at GLM-5's real routing the tuner's Gluon gemm1 entries take the whole op to
0.89-0.98x its time with Triton tiles at decode, 0.95-0.96x at B = 2048-8192. The Gluon gemm2 runs correctly
(tests/test_gluon.py) but measured no faster than the Triton gemm2 at any step: not offered.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import torch

from sglang_glm5 import env
from sglang_glm5._ints import cdiv
from sglang_glm5.hardware import device_arch, wgmma_from_registers
from sglang_glm5.routing import Route, interpreting
from sglang_glm5.tiles import GemmConfig, k_splits_cover

# The tiles the tuner offers for gemm1. TWO_STAGE_TILE: 53248 B and 163-168 registers against TILE's 79872 B and
# 193-194 (sm_90 AOT, Triton 3.6), so three programs per SM instead of two; it wins gemm1 at most GLM-5 decode steps on
# the H200. Under Triton 3.8 its split forms take 188 registers (two per SM). GATE_THEN_UP_TILE: the 2-stage tile with
# gemm1's gate-then-up order (``GemmConfig.gate_then_up``: one matrix's packed words and scale codes in registers at a
# time), 123-128 registers, four programs per SM; the same bits as the Triton gemm1; tuned with its own split plans (6-8
# programs per SM at GLM-5 EP8) it takes the op 1-6% faster at some steps, where the h200 cache holds it.
TILE = GemmConfig(16, 64, 256, num_warps=4, num_stages=3, gluon=True)
TWO_STAGE_TILE = GemmConfig(16, 64, 256, num_warps=4, num_stages=2, gluon=True)
GATE_THEN_UP_TILE = dataclasses.replace(TWO_STAGE_TILE, gate_then_up=True)
# gemm2's tile: one weight matrix, so 128 rows take the registers gemm1's 64 do (sm_90 AOT, Triton 3.6 and 3.8:
# 16x128x256-w4-s3 219 registers, 79872 B; 16x64x256-w4-s3 120 registers, 52224 B)
GEMM2_TILE = GemmConfig(16, 128, 256, num_warps=4, num_stages=3, gluon=True)
# The tiles the tuner offers per GEMM: none for gemm2, whose best Gluon trial took 0.99-1.16x the best Triton trial's
# time at every GLM-5 decode step (1.02-1.09x the op at B = 32-256 even with its row pointers computed once a tile).
#
# The same gemm1 tiles with their copies on a producer warp group (``GemmConfig.producer``, ``-ws``:
# kernels/nvfp4_moe_gluon_ws.py), the same bits: 0.974-0.978x the op at TP8 B = 7-8 with the interleaved 3-stage tile at
# one program per SM (the h200 cache takes it there), 1.035x at EP8 B = 1 with the same tile and plan, 0.98-1.16x where
# the cached tiles run several programs per SM: a choice per step, the tuner's.
PRODUCER_TILES = (dataclasses.replace(TILE, producer=True), dataclasses.replace(GATE_THEN_UP_TILE, producer=True))
TILES: dict[str, tuple[GemmConfig, ...]] = {"gemm1": (TILE, TWO_STAGE_TILE, GATE_THEN_UP_TILE, *PRODUCER_TILES),
                                            "gemm2": ()}  # fmt: skip
# Above the decode buckets (chunked prefill) the tuner times its leading Triton tiles of these GEMMs again in Gluon,
# in both orders of gemm1's wgmmas (``prefill_forms``): on the H200 gemm1 in Gluon took the op 0.95-0.96x at GLM-5
# B = 2048 and 8192, gemm2 1.04-1.31x (never faster): gemm1 only.
PREFILL_KERNELS = ("gemm1",)
# Also offered at those buckets, beside the leading tile's forms: a 256-deep K step in two stages (204800 B, 247
# registers, sm_90 AOT Triton 3.8; half the K steps and barriers of the 128-deep tiles): gemm1 alone 0.90-0.96x the
# leading tiles at GLM-5 B = 4096-8192 on the H200.
PREFILL_TILES = (GemmConfig(128, 128, 256, num_warps=8, num_stages=2, gluon=True, gate_then_up=True),)
# The chunked-prefill tiles (routing blocks of 64 or more pairs) launch gemm1 with its N tiles first in the grid
# (``launch``'s blocks_last): the programs in flight then share a few blocks' activation rows in L2, where with the
# blocks first every N tile reads all of them again (the op 0.965-0.992x at GLM-5 B = 2048-8192 on the H200). Unsplit
# only: no shipped prefill entry splits K at GLM-5's sizes, and the split form in this order has not run on a GPU.
BLOCKS_LAST_FROM_M = 64
MAX_GRID_Y = 65535  # CUDA's limit on grid axis 1
LOOKAHEAD = 1  # quarters of wgmmas in flight while the next is decoded (0 and 2 measured no better)
# 2-stage gemm1 tiles of 64 rows in the gate-then-up order are compiled for at most 128 registers, so that four
# programs fit an SM (65536 registers, 128 threads each) as shared memory allows: Triton 3.8 gives the split form 129
# otherwise (ptxas: no spills at 128, Triton 3.6 and 3.8)
REGISTER_CAP = 128
# A producer form's launch cap (``maxnreg``) and its producer's registers a thread, by gemm1's order (gate then up?).
# The cap times the CTA's eight warps is its register budget; in the partitions the producer warp group takes its
# registers and the consumers the rest (``setmaxnreg``): gate then up 112 beside 48 (three programs per SM, no spills),
# interleaved 160 beside 48 (two per SM; it spills in its K loop at 112). sm_90 AOT, Triton 3.6 and 3.8.
PRODUCER_FORMS = {True: (80, 48), False: (104, 48)}
PRODUCER_WARPS = 4


@functools.cache
def available() -> bool:
    """Whether this Triton has the Gluon the kernel is written for (Hopper's warpgroup MMA, cp.async, a CTA barrier:
    Triton 3.6 and 3.8 checked)."""
    try:
        import sglang_glm5.kernels.nvfp4_moe_gluon  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


@functools.cache
def producer_available() -> bool:
    """Whether this Triton has what the producer form adds (``warp_specialize``, mbarriers, cp.async arrivals on
    them: Triton 3.6 and 3.8 checked)."""
    try:
        import sglang_glm5.kernels.nvfp4_moe_gluon_ws  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


def runs_on(arch: int) -> bool:
    """Whether the kernel can run on ``sm_{arch}`` with this Triton: warpgroup MMA with a register operand (sm_90)
    and Gluon."""
    return wgmma_from_registers(arch) and available()


def applies(
    device: torch.device, layout: str, k_size: int, tile: GemmConfig, dtype: torch.dtype, allowed: bool | None = None
) -> bool:
    """Whether a GEMM launch with ``tile`` (a config marked ``gluon``) runs in Gluon: ``allowed`` (default: the
    switch ``SGLANG_GLM5_GLUON_GEMM1``, on by default; the op passes ``w4a16_plan.PlanSettings.gluon``), a
    CUDA sm_90 device (not the interpreter), bf16 activations (the kernels' wgmma is bf16: fp16 would be read as
    bf16), weights in the kernel_wgmma layout, K (H for gemm1, I for gemm2) a multiple of the tile's K step, and for a
    producer form a Triton that has it."""
    if not tile.gluon or not (env.get(env.GLUON_GEMM1) if allowed is None else allowed):
        return False
    if interpreting() or device.type != "cuda" or dtype != torch.bfloat16:
        return False
    if layout != "kernel_wgmma" or k_size % tile.block_k or (tile.producer and not producer_available()):
        return False
    arch = device_arch(device)
    return arch is not None and runs_on(arch)


def prefill_forms(kernel: str, tile: GemmConfig) -> list[GemmConfig]:
    """What the tuner times beside a Triton ``tile`` at chunked-prefill buckets, for a kernel of PREFILL_KERNELS:
    the same tile and plan in Gluon, in each order of gemm1's wgmmas (none for a tile the Gluon kernels do not
    take, ``GemmConfig.gluon_takes``: a K step of 64, say), then PREFILL_TILES; beside a tile in Gluon already
    (a cache entry that ``tune --splits-only`` starts from), PREFILL_TILES alone."""
    if kernel not in PREFILL_KERNELS:
        return []
    forms = []
    if tile.gluon_takes and not tile.gluon:
        gluon = dataclasses.replace(tile, gluon=True)
        forms = [gluon, dataclasses.replace(gluon, gate_then_up=True)] if kernel == "gemm1" else [gluon]
    return forms + [t for t in PREFILL_TILES if t not in forms and t != tile.without_plan()]


def counters_needed(num_blocks: int, inter: int, tile: GemmConfig = TILE) -> int:
    """The zeroed int32 counters a split launch needs: one per (block, N tile)."""
    return num_blocks * cdiv(inter, tile.block_n)


def launch(
    x, w13, w13_scale, gs13, route: Route, h, top_k, gate_row0, up_row0,
    *, splits: int, k_per_split: int, counters: torch.Tensor | None, pdl: bool, tile: GemmConfig = TILE,
    lookahead: int = LOOKAHEAD, blocks_last: bool | None = None, ready: torch.Tensor | None = None,
):  # fmt: skip
    """gemm1 into h [P, I] (the arguments of ``w4a16.launch_gemm1``): K in ``splits`` of ``k_per_split`` columns
    (whole K steps; ``w4a16_plan.k_splits``), with ``counters`` (``counters_needed``, zeroed) when split; ``ready``: the
    per-block ready counters (``w4a16.launch_gemm1``, which returns what this returns: the split partials, or None).
    ``tile``: a config marked gluon (its block_n, block_k and num_stages); ``lookahead``: quarters of wgmmas left in
    flight; ``blocks_last``: the grid's N tiles first, so that a block's N tiles run side by side, while the blocks
    fit grid axis 1 (None: for routing blocks of ``BLOCKS_LAST_FROM_M`` pairs or more, K unsplit)."""
    if tile.producer and lookahead != LOOKAHEAD:
        raise ValueError(f"gluon gemm1: the producer form keeps {LOOKAHEAD} quarter(s) in flight, got {lookahead}")
    from sglang_glm5.kernels import nvfp4_moe_gluon as _g

    num_pairs, inter = h.shape
    num_blocks = route.block_expert.numel()
    hidden = x.shape[1]
    _check_tile(tile, hidden, splits, k_per_split, "gemm1", "H")
    part = h
    if splits > 1:
        if counters is None or counters.numel() < counters_needed(num_blocks, inter, tile):
            raise ValueError(f"counters: a split gluon gemm1 needs {counters_needed(num_blocks, inter, tile)} zeroed "
                             "int32")  # fmt: skip
        part = torch.empty((splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device)
    w13 = w13.view(torch.int16)  # 4 nibbles per element
    blocks, n_tiles, split_axis = _g.grid(num_blocks, inter, tile.block_n, splits)
    if blocks_last is None:
        blocks_last = tile.block_m >= BLOCKS_LAST_FROM_M and splits == 1
    blocks_last = blocks_last and blocks <= MAX_GRID_Y  # the blocks on grid axis 1 only while they fit it
    _gemm1_kernel(tile)[(n_tiles, blocks, split_axis) if blocks_last else (blocks, n_tiles, split_axis)](
        x, w13, w13_scale.view(torch.uint8), gs13, route.sorted_ids, route.block_expert, h, part,
        route.used_blocks if counters is None else counters, route.used_blocks if ready is None else ready,
        num_pairs, top_k, inter, x.shape[1], k_per_split,
        x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1), gs13.stride(0),
        gs13.stride(1) if gs13.dim() == 2 else 0, h.stride(0), gate_row0, up_row0,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, WARPS=tile.num_warps, BLOCK_K=tile.block_k,
        STAGES=tile.num_stages, LOOKAHEAD=lookahead, GATE_THEN_UP=tile.gate_then_up, SPLITS=splits, PDL=pdl,
        BLOCKS_LAST=blocks_last, READY=ready is not None, num_warps=tile.num_warps, launch_pdl=pdl,
        **_register_cap("gemm1", tile), **_producer(tile),
    )  # fmt: skip
    return part if splits > 1 else None


def _gemm1_kernel(tile: GemmConfig):
    """The Gluon gemm1 kernel for ``tile``: with its copies on a producer warp group, or issuing them itself."""
    if tile.producer:
        from sglang_glm5.kernels import nvfp4_moe_gluon_ws

        return nvfp4_moe_gluon_ws.nvfp4_moe_gemm1_ws_kernel
    from sglang_glm5.kernels import nvfp4_moe_gluon

    return nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel


def _producer(tile: GemmConfig) -> dict:
    """The producer form's constexprs (its warps and registers), if ``tile`` asks for one."""
    if not tile.producer:
        return {}
    return {"PRODUCER_WARPS": PRODUCER_WARPS, "PRODUCER_REGS": PRODUCER_FORMS[tile.gate_then_up][1]}


def launch_gemm2(
    h, w2, w2_scale, gs2, topk_weights_flat, route: Route, y,
    *, splits: int, k_per_split: int, per_program: int, pdl: bool, tile: GemmConfig, lookahead: int = LOOKAHEAD,
):  # fmt: skip
    """gemm2 into y (the arguments of ``w4a16.launch_gemm2``): [P, H], or with ``splits`` > 1 the fp32 partials
    [splits, P, H] that the top-k sum adds; ``per_program`` N tiles a program (one when split)."""
    from sglang_glm5.kernels import nvfp4_moe_gluon as _g

    num_pairs, inter = h.shape
    hidden = y.shape[-1]
    _check_tile(tile, inter, splits, k_per_split, "gemm2", "I")
    if splits > 1 and per_program != 1:
        raise ValueError(f"gluon gemm2: a split K ({splits}) needs one N tile per program, got {per_program}")
    w2 = w2.view(torch.int16)
    _g.nvfp4_moe_gemm2_gluon_kernel[_g.grid(route.block_expert.numel(), hidden, tile.block_n, splits, per_program)](
        h, w2, w2_scale.view(torch.uint8), gs2, topk_weights_flat, route.sorted_ids, route.block_expert, y,
        num_pairs, hidden, inter, k_per_split,
        h.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), y.stride(-2),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, WARPS=tile.num_warps, BLOCK_K=tile.block_k,
        STAGES=tile.num_stages, LOOKAHEAD=lookahead, SPLITS=splits, PDL=pdl, num_warps=tile.num_warps, launch_pdl=pdl,
    )  # fmt: skip


def _register_cap(kernel: str, tile: GemmConfig) -> dict:
    """The compile option that caps a gemm1 tile's registers (REGISTER_CAP, or a producer form's PRODUCER_FORMS), if
    any."""
    if kernel == "gemm1" and tile.producer:
        return {"maxnreg": PRODUCER_FORMS[tile.gate_then_up][0]}
    capped = kernel == "gemm1" and tile.gate_then_up and tile.block_n == 64 and tile.num_stages == 2
    return {"maxnreg": REGISTER_CAP} if capped else {}


def _check_producer(tile: GemmConfig, kernel: str) -> None:
    if tile.producer and kernel != "gemm1":
        raise ValueError(f"gluon {kernel}: a producer warp group is a form of gemm1, got {tile.label}")


def _check_tile(tile: GemmConfig, k_size: int, splits: int, k_per_split: int, kernel: str, k_name: str) -> None:
    if not tile.gluon:  # GemmConfig refuses a Gluon config the kernels cannot run
        raise ValueError(f"gluon {kernel}: expected a config marked gluon, got {tile.label}")
    if tile.gate_then_up and kernel != "gemm1":
        raise ValueError(f"gluon {kernel}: gate_then_up orders gemm1's two matrices, got {tile.label}")
    _check_producer(tile, kernel)
    if k_size % tile.block_k or not k_splits_cover(k_size, tile.block_k, splits, k_per_split):
        raise ValueError(f"gluon {kernel}: {splits} splits of {k_per_split} must cover {k_name} = {k_size} in whole K "
                         f"steps of {tile.block_k}, none empty")  # fmt: skip


def aot_job(
    arch: int, splits: int, pdl: bool, tile: str = TILE.label, kernel: str = "gemm1", ready: bool = False
) -> dict:
    """An ``sglang_glm5.aot`` job (a fresh process, the interpreter off): ``kernel`` compiled for ``sm_{arch}`` with
    ``tile`` (a label), as its shared bytes, which instructions its PTX holds and how many atomics."""
    compiled = aot(arch, splits=splits, pdl=pdl, tile=GemmConfig.from_label(tile), kernel=kernel, ready=ready)
    ptx = compiled.asm["ptx"]
    found = {name: text in ptx for name, text in PTX_MARKS.items()}
    cap = re.search(r"^\s*\.maxnreg\s+(\d+)", ptx, re.M)
    atomics = ptx.count("atom.global")
    return {"shared": compiled.metadata.shared, "maxnreg": cap and int(cap.group(1)), "atomics": atomics, **found}


# What ``aot_job`` looks for in the PTX.
PTX_MARKS = {"wgmma": "wgmma.mma_async", "cp_async": "cp.async", "gdc_wait": "griddepcontrol.wait",
             "gdc_launch": "griddepcontrol.launch_dependents", "atomic": "atom.global", "setmaxnreg": "setmaxnreg",
             "mbarrier_arrive": "cp.async.mbarrier.arrive"}  # fmt: skip
# Pointer arguments of the two kernels and their element types; every other non-constexpr argument is an i32.
_POINTERS = {"x_ptr": "*bf16", "w_ptr": "*i16", "ws_ptr": "*u8", "wgs_ptr": "*fp32", "sorted_ids_ptr": "*i32",
             "block_expert_ptr": "*i32", "h_ptr": "*bf16", "part_ptr": "*fp32", "counter_ptr": "*i32",
             "ready_ptr": "*i32", "topk_weights_ptr": "*fp32", "y_ptr": "*bf16"}  # fmt: skip
# As in a real launch on GLM-5 shapes: pointers and sizes multiples of 16, except counts and row offsets.
_NOT_DIVISIBLE = {"num_pairs", "top_k", "stride_gse", "stride_gsg", "gate_row0", "up_row0"}


def aot(
    arch: int = 90, *, splits: int = 1, pdl: bool = False, tile: GemmConfig = TILE, lookahead: int = LOOKAHEAD,
    kernel: str = "gemm1", ready: bool = False,
):  # fmt: skip
    """Triton's ahead-of-time compile of ``kernel`` for ``sm_{arch}`` (no GPU needed): the compiled kernel. Not in a
    process that imported the kernels under ``TRITON_INTERPRET=1``: run it through ``aot_job``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_glm5.kernels import nvfp4_moe_gluon as _g

    _check_producer(tile, kernel)
    fn = _gemm1_kernel(tile) if kernel == "gemm1" else _g.nvfp4_moe_gemm2_gluon_kernel
    consts = {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "WARPS": tile.num_warps, "BLOCK_K": tile.block_k,
              "STAGES": tile.num_stages, "LOOKAHEAD": lookahead, "SPLITS": splits, "PDL": pdl}  # fmt: skip
    if kernel == "gemm1":
        consts.update(GATE_THEN_UP=tile.gate_then_up, BLOCKS_LAST=False, READY=ready, **_producer(tile))
    pointers = {**_POINTERS, "y_ptr": "*fp32" if splits > 1 else "*bf16"}
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a] != "constexpr" and a not in _NOT_DIVISIBLE}  # fmt: skip
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": tile.num_warps, **_register_cap(kernel, tile)}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
