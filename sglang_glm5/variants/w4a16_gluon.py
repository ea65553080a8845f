"""The W4A16 family's gemm1 in Gluon on sm_90, at decode sizes: when it applies, and its launch.

``kernels/nvfp4_moe_gluon.py`` is the same gemm1 as the Triton kernel (same decode, dots and K order, the op's K
splits and its deterministic sum) with the copies, the wgmma waits and the scale reads scheduled by hand. It takes
one tile (``TILE``), split over K by the op's plan (``w4a16.plan_launch``) for the tile's ``programs_per_sm``. Opt-in
(``SGLANG_GLM5_GLUON_GEMM1``): it is not in the tuner's search yet, so a call that turns it on skips the cached
gemm1 tile and split for these sizes. H200, GLM-5, the whole op at real routing, seeds 43 and 67 (bench/README.md,
run 29; B = 1, 2, 3, 4, 6, 8): EP8 0.84-0.98x, TP8 B = 1-3 0.89-0.93x, B = 8 0.99x, B = 4-6 1.01-1.02x; at B = 12-16
(above ``MAX_TOKENS_PER_EXPERT``, without PDL) 1.00-1.07x, so it stops there.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import torch

from sglang_glm5 import env
from sglang_glm5.hardware import wgmma_from_registers
from sglang_glm5.routing import Route, interpreting
from sglang_glm5.tiles import GemmConfig

# programs_per_sm: the K split's aim (1 was better at some steps, worse at others: bench/README.md, run 29)
TILE = GemmConfig(16, 64, 256, num_warps=4, num_stages=3, programs_per_sm=2)
LOOKAHEAD = 1  # quarters of wgmmas in flight while the next is decoded (0 and 2 measured no better)
MAX_TOKENS_PER_EXPERT = Fraction(1, 4)  # GLM-5 B <= 8 tokens a step (top-8 of 256 experts)


@functools.cache
def available() -> bool:
    """Whether this Triton has the Gluon the kernel is written for (Hopper's warpgroup MMA, cp.async, a CTA barrier:
    Triton 3.6 and 3.8 checked)."""
    try:
        import sglang_glm5.kernels.nvfp4_moe_gluon  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


def applies(device: torch.device, layout: str, hidden: int, block_m: int, tokens_per_expert: float) -> bool:
    """Whether the op's gemm1 runs in Gluon: switched on, a CUDA sm_90 device (not the interpreter), weights in the
    kernel_wgmma layout, routing blocks of 16 pairs, H a multiple of the tile's K step, at most
    ``MAX_TOKENS_PER_EXPERT``, and a Triton with Gluon."""
    if not env.get(env.GLUON_GEMM1):
        return False
    if interpreting() or device.type != "cuda":
        return False
    if layout != "kernel_wgmma" or block_m != TILE.block_m or hidden % TILE.block_k:
        return False
    if tokens_per_expert > MAX_TOKENS_PER_EXPERT:
        return False
    major, minor = torch.cuda.get_device_capability(device)
    if not wgmma_from_registers(10 * major + minor):
        return False
    return available()


def counters_needed(num_blocks: int, inter: int) -> int:
    """The zeroed int32 counters a split launch needs: one per (block, N tile)."""
    return num_blocks * -(-inter // TILE.block_n)


def launch(
    x, w13, w13_scale, gs13, route: Route, h, top_k, gate_row0, up_row0,
    *, splits: int, k_per_split: int, counters: torch.Tensor | None, pdl: bool,
):  # fmt: skip
    """gemm1 into h [P, I] (the arguments of ``w4a16.launch_gemm1``): K in ``splits`` of ``k_per_split`` columns
    (whole K steps; ``w4a16.k_splits``), with ``counters`` (``counters_needed``, zeroed) when split."""
    from sglang_glm5.kernels import nvfp4_moe_gluon as _g

    num_pairs, inter = h.shape
    num_blocks = route.block_expert.numel()
    hidden = x.shape[1]
    if hidden % TILE.block_k or k_per_split % TILE.block_k or not 0 <= (splits - 1) * k_per_split < hidden <= (
            splits * k_per_split):  # fmt: skip
        raise ValueError(f"gluon gemm1: {splits} splits of {k_per_split} must cover H = {hidden} in whole K steps of "
                         f"{TILE.block_k}, none empty")  # fmt: skip
    part = h
    if splits > 1:
        if counters is None or counters.numel() < counters_needed(num_blocks, inter):
            raise ValueError(f"counters: a split gluon gemm1 needs {counters_needed(num_blocks, inter)} zeroed int32")
        part = torch.empty((splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device)
    w13 = w13.view(torch.int16)  # 4 nibbles per element
    _g.nvfp4_moe_gemm1_gluon_kernel[_g.grid(num_blocks, inter, TILE.block_n, splits)](
        x, w13, w13_scale.view(torch.uint8), gs13, route.sorted_ids, route.block_expert, h, part,
        route.used_blocks if counters is None else counters,
        num_pairs, top_k, inter, x.shape[1], k_per_split,
        x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1), gs13.stride(0),
        gs13.stride(1) if gs13.dim() == 2 else 0, h.stride(0), gate_row0, up_row0,
        BLOCK_N=TILE.block_n, BLOCK_K=TILE.block_k, STAGES=TILE.num_stages, LOOKAHEAD=LOOKAHEAD, SPLITS=splits,
        PDL=pdl, num_warps=TILE.num_warps, launch_pdl=pdl,
    )  # fmt: skip


def aot_job(arch: int, splits: int, pdl: bool) -> dict:
    """An ``sglang_glm5.aot`` job (a fresh process, the interpreter off): the kernel compiled for ``sm_{arch}``, as
    its shared bytes and which instructions its PTX holds."""
    kernel = aot(arch, splits=splits, pdl=pdl)
    ptx = kernel.asm["ptx"]
    found = {name: text in ptx for name, text in PTX_MARKS.items()}
    return {"shared": kernel.metadata.shared, **found}


# What ``aot_job`` looks for in the PTX.
PTX_MARKS = {"wgmma": "wgmma.mma_async", "cp_async": "cp.async", "gdc_wait": "griddepcontrol.wait",
             "gdc_launch": "griddepcontrol.launch_dependents", "atomic": "atom.global"}  # fmt: skip


def aot(arch: int = 90, *, splits: int = 1, pdl: bool = False):
    """Triton's ahead-of-time compile of the kernel for ``sm_{arch}`` (no GPU needed): the compiled kernel. Not in a
    process that imported the kernels under ``TRITON_INTERPRET=1``: run it through ``aot_job``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_glm5.kernels import nvfp4_moe_gluon as _g

    fn = _g.nvfp4_moe_gemm1_gluon_kernel
    consts = {"BLOCK_N": TILE.block_n, "BLOCK_K": TILE.block_k, "STAGES": TILE.num_stages, "LOOKAHEAD": LOOKAHEAD,
              "SPLITS": splits, "PDL": pdl}  # fmt: skip
    pointers = {"x_ptr": "*bf16", "w_ptr": "*i16", "ws_ptr": "*u8", "wgs_ptr": "*fp32", "sorted_ids_ptr": "*i32",
                "block_expert_ptr": "*i32", "h_ptr": "*bf16", "part_ptr": "*fp32", "counter_ptr": "*i32"}  # fmt: skip
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    # as in a real launch on GLM-5 shapes: pointers and sizes multiples of 16, except counts and row offsets
    odd = {"num_pairs", "top_k", "stride_gse", "stride_gsg", "gate_row0", "up_row0"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a] != "constexpr" and a not in odd}  # fmt: skip
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": TILE.num_warps})
