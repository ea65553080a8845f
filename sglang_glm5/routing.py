"""Per-call input checks, the routing sort and the top-k sum of the NVFP4 MoE ops (W4A16 and W4A4).

    P = T * k (token, slot) pairs; -1 ids (experts on other ranks) are dropped

- ``validate_call``: what changes per call (the weights are checked once: ``sglang_glm5.weights``); every
  message names the argument, what was expected and what came;
- ``route_pairs``: the pairs sorted by expert into blocks of block_m, in one launch, no host sync;
- ``prepare_activations``: activations in the K order the GEMM kernels read;
- ``sum_over_slots``: out[t] = sum of the pair rows of token t, deterministic.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from sglang_glm5 import env
from sglang_glm5._ints import cdiv, next_power_of_2
from sglang_glm5.hardware import device_arch, launches_dependents
from sglang_glm5.kernels import nvfp4_route as _k
from sglang_glm5.nvfp4 import LAYOUTS, activation_period
from sglang_glm5.tiles import MoeConfig
from sglang_glm5.weights import Nvfp4MoeWeights, check_tensor

PERMUTE_T, PERMUTE_K = 16, 256  # the activation layout's tile: rows x columns per program
# From 32 rows to 256 (GLM-5 B = 32-256, where every expert of a rank is busy) the activation layout's programs take
# PERMUTE_T_BUSY rows each: a quarter as many programs behind the routing launch's E + 1 sorting ones (T a multiple of
# 64); the same bits, the op about 2% faster at B = 256 (H100, GLM-5 at real routing). Fewer rows keep PERMUTE_T (no
# gain at B = 8), and so do chunked-prefill sizes (not measured with 64).
PERMUTE_T_BUSY = 64
PERMUTE_BUSY_ROWS = (32, 256)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


def permute_rows(num_rows: int) -> int:
    """Rows of the activation layout's tile for T = ``num_rows`` tokens: ``PERMUTE_T_BUSY`` in ``PERMUTE_BUSY_ROWS``."""
    low, high = PERMUTE_BUSY_ROWS
    return PERMUTE_T_BUSY if low <= num_rows <= high else PERMUTE_T


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------------------------------------
# Input validation: every message names the argument, what was expected and what came.


def validate_call(hidden_states, weights: Nvfp4MoeWeights, topk_weights, topk_ids) -> tuple[int, int]:
    """What changes per call, against the layer's checked weights: returns (T, k) or raises TypeError /
    ValueError naming the argument."""
    if not isinstance(weights, Nvfp4MoeWeights):
        raise TypeError(f"weights: expected an Nvfp4MoeWeights (weights.Nvfp4MoeWeights.build), got "
                        f"{type(weights).__name__}")  # fmt: skip
    check_tensor("hidden_states", hidden_states, ACTIVATION_DTYPES, (None, weights.hidden))
    num_tokens = hidden_states.shape[0]
    if hidden_states.stride(1) != 1:
        raise ValueError(
            f"hidden_states: rows must be contiguous (stride(1) == 1), got strides {hidden_states.stride()}"
        )
    check_tensor("topk_weights", topk_weights, (torch.float32,), (num_tokens, None))
    top_k = topk_weights.shape[1]
    check_tensor("topk_ids", topk_ids, (torch.int32, torch.int64), (num_tokens, top_k))
    if top_k < 1:
        raise ValueError("topk_ids: top-k must be at least 1, got 0 columns")
    device = hidden_states.device
    for name, t in (("weights", weights.w13), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device != device:
            raise ValueError(f"{name}: expected device {device} (that of hidden_states), got {t.device}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"hidden_states: expected a CUDA tensor, got device {device} "
            "(CPU tensors run only through the Triton interpreter, TRITON_INTERPRET=1)"
        )
    return num_tokens, top_k


def pdl_runs_on(device: torch.device) -> bool:
    """Whether launches on ``device`` can use programmatic dependent launch (each kernel starting while the one
    before it runs, then waiting for it on the GPU): a CUDA device of sm_90+ (``hardware.launches_dependents``), not
    the interpreter."""
    if device.type != "cuda" or interpreting():
        return False
    arch = device_arch(device)
    return arch is not None and launches_dependents(arch)


def uses_pdl(device: torch.device) -> bool:
    """``pdl_runs_on(device)`` with ``SGLANG_GLM5_PDL`` on (the default)."""
    return pdl_runs_on(device) and bool(env.get(env.PDL))


def check_options(config, num_global_experts, num_experts: int) -> None:
    """The op's keyword options: ``config`` a MoeConfig or None, ``num_global_experts`` None or an int of at
    least the local experts (TypeError / ValueError naming them)."""
    if config is not None and not isinstance(config, MoeConfig):
        raise TypeError(f"config: expected MoeConfig or None, got {type(config).__name__}")
    if num_global_experts is not None and (not isinstance(num_global_experts, int) or num_global_experts < num_experts):
        raise ValueError(
            f"num_global_experts: expected an int >= the {num_experts} local experts, got {num_global_experts!r}"
        )


def check_ids_in_range(topk_ids: torch.Tensor, num_experts: int) -> None:
    """-1 (expert on another rank) or a local expert id; skipped while a CUDA graph is captured."""
    if topk_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    bad = (topk_ids < -1) | (topk_ids >= num_experts)
    if bool(bad.any()):
        value = int(topk_ids[bad][0])
        raise ValueError(f"topk_ids: expected values in [-1, {num_experts - 1}] (-1 = not on this rank), got {value}")


# ---------------------------------------------------------------------------------------------
# Routing: (token, slot) pairs sorted by expert into blocks of block_m, without a host sync.


class Route(NamedTuple):
    """(token, slot) pairs sorted by expert into blocks of block_m pairs that share an expert."""

    sorted_ids: torch.Tensor  # [num_blocks * block_m] int32 pair ids; P = padding
    block_expert: torch.Tensor  # [num_blocks] int32 expert of each block; -1 = unused
    used_blocks: torch.Tensor  # [1] int32: blocks 0 .. used - 1 hold pairs, the rest are unused


def num_blocks_bound(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the routing blocks: at most min(P, E) experts hold pairs, each wasting at most
    block_m - 1 slots of its last block; one more block so that the bound is never zero."""
    return (num_pairs + min(num_pairs, num_experts) * (block_m - 1)) // block_m + 1


# From this many pairs the routing launch walks the ids in wide steps on 8 warps (``route_block``).
WIDE_ROUTE_PAIRS = 32768


def route_block(num_pairs: int, num_experts: int) -> tuple[int, int]:
    """(ids per loop step, warps) of the routing launch. Each of its E + 1 programs walks all P ids twice in
    steps of this many: up to 1024 on 4 warps, so that a decode step (a few pairs) takes a small histogram;
    from ``WIDE_ROUTE_PAIRS`` pairs (GLM-5 B >= 4096) 8192 on 8 warps, 4096 above 64 experts (whose histogram
    is wider): on the H200 the wide step takes GLM-5 EP8's launch at B = 8192 to 74 us from 186; at B = 2048 the
    narrow step is as fast or faster. From ``CHUNKED_ROUTE_PAIRS`` pairs the op routes in two launches instead
    (``route_chunked``: 104 against 272 us for TP8's two routings at B = 8192), so the wide step serves only a
    one-launch routing asked for with PDL at those sizes (the op asks for PDL only below one token per expert)."""
    if num_pairs >= WIDE_ROUTE_PAIRS:
        return (8192 if num_experts <= 64 else 4096), 8
    return max(16, min(1024, next_power_of_2(num_pairs))), 4


# From this many pairs (GLM-5 B >= 1024) the routing is two launches over chunks of the ids (``route_chunked``)
# instead of E + 1 programs that each walk all of them: the defaults of ``route_pairs``' ``chunked_from`` and
# ``chunk``.
CHUNKED_ROUTE_PAIRS = 8192
ROUTE_CHUNK = 2048  # pairs a program of the chunked routing


def route_chunked(
    ids, num_experts, block_m, route: Route, zero, x, xp, tiles: int, wgmma: bool, rows: int, chunk: int = ROUTE_CHUNK
) -> None:
    """The routing into ``route``'s tensors as two launches over chunks of ``chunk`` pairs: the first counts
    each chunk's pairs per expert (and lays out the activations x into xp in ``tiles`` programs, zeroes ``zero``), the
    second adds the counts up and places each chunk's pairs where the one-launch sort would (the same outputs). Its
    programs each read CHUNK ids and the table of counts, where the one-launch sort's E + 1 programs each read all P
    ids twice."""
    sorted_ids, block_expert, used_blocks = route
    num_pairs = ids.numel()
    chunks = cdiv(num_pairs, chunk)
    e_pad = max(16, next_power_of_2(num_experts))
    counts = torch.empty((chunks, e_pad), dtype=torch.int32, device=ids.device)
    _k.route_count_kernel[(chunks + tiles,)](
        ids, counts, used_blocks if zero is None else zero, x, xp, num_pairs, num_experts,
        0 if zero is None else zero.numel(), *(x.shape if tiles else (0, 0)), x.stride(0), xp.stride(0),
        E_PAD=e_pad, CHUNK=chunk, PERMUTE=tiles > 0, PERMUTE_T=rows, PERMUTE_K=PERMUTE_K,
        WGMMA=wgmma, num_warps=8,
    )  # fmt: skip
    _k.route_place_kernel[(chunks + num_experts + 1,)](
        ids, counts, sorted_ids, block_expert, used_blocks, num_pairs, num_experts, block_expert.numel(),
        BLOCK_M=block_m, E_PAD=e_pad, CHUNK=chunk, ROWS=16, num_warps=8,
    )  # fmt: skip


def route_pairs(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    zero: torch.Tensor | None = None,
    permute: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    pdl: bool = False,
    layout: str = "checkpoint",
    each_pair: bool = False,
    first_expert: int = 0,
    chain: tuple[int, int] = (0, 1),
    chunked_from: int = CHUNKED_ROUTE_PAIRS,
    chunk: int = ROUTE_CHUNK,
) -> Route:
    """Sort the P = T*k pairs by expert into blocks of block_m pairs that share an expert, in one launch (two from
    ``chunked_from`` pairs: ``route_chunked``, over chunks of ``chunk`` pairs).

    Pair ids in a block are in increasing order; slots past an expert's count hold P (padding).
    Blocks past the last used one get expert -1; ids outside [0, E) are dropped. The number of blocks
    is ``num_blocks_bound``, so sizes never depend on the ids' values: no host synchronization
    (CUDA-graph safe). ``zero`` (int32), if given, is set to 0 by the same launch (split-K counters);
    ``permute`` = (x, xp), if given, has the same launch write ``prepare_activations(x, layout)`` into xp
    (``layout``: the weights' that the GEMMs read, ``nvfp4.LAYOUTS``).
    ``pdl``: launch with programmatic dependent launch (``uses_pdl``).
    The torch reference is ``sglang_glm5.reference.align_pairs_by_expert_reference``.

    ``each_pair`` (at most E pairs): no sort, one routing program instead of E + 1; block r holds the r-th valid
    pair alone, in pair order, so two pairs of one expert take two blocks (``w4a16_plan.PlanSettings``). The
    GEMMs compute each pair's row as they would in a shared block: the op's output does not change.

    ``first_expert``: route the group of experts first_expert .. first_expert + E - 1 alone (id i is that group's
    expert i - first_expert; every other id is dropped), in one launch whatever the pair count.

    ``chain`` = (c, n): of the experts that hold pairs, in id order, route every n-th from the c-th alone (ids keep
    their values; the others' pairs are dropped), in one launch: n such routings share the active experts out as
    evenly as they go, whichever experts the ids touch. Blocks: the bound for ceil(E / n) experts. Not with
    ``each_pair``.
    """
    ids = topk_ids.reshape(-1)
    num_pairs = ids.numel()
    index, chains = chain
    if not 0 <= index < chains:
        raise ValueError(f"chain: (c, n) with 0 <= c < n, got {chain}")
    if chains > 1 and each_pair:
        raise ValueError("chain: a routing of every n-th active expert sorts; each_pair does not")
    num_blocks = num_blocks_bound(num_pairs, cdiv(num_experts, chains), block_m)
    if each_pair and num_pairs > num_experts:  # then num_blocks_bound gives a block per pair (and one more)
        raise ValueError(f"each_pair: at most {num_experts} pairs (the experts), got {num_pairs}")
    sorted_ids = torch.empty(num_blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=ids.device)
    used_blocks = torch.empty(1, dtype=torch.int32, device=ids.device)
    route = Route(sorted_ids, block_expert, used_blocks)
    x, xp = permute if permute is not None else (used_blocks, used_blocks)
    num_rows, x_cols = x.shape if permute is not None else (0, 0)
    rows = permute_rows(num_rows)
    tiles = cdiv(num_rows, rows) * cdiv(x_cols, PERMUTE_K)
    if num_pairs >= chunked_from and not each_pair and not pdl and not first_expert and chains == 1:
        route_chunked(ids, num_experts, block_m, route, zero, x, xp, tiles, _wgmma_order(layout, x_cols), rows, chunk)
        return route
    block, warps = route_block(num_pairs, num_experts)
    routers = 1 if each_pair else num_experts + 1
    _k.moe_align_kernel[(routers + tiles,)](
        topk_ids_ptr=ids,
        sorted_ids_ptr=sorted_ids,
        block_expert_ptr=block_expert,
        used_blocks_ptr=used_blocks,
        zero_ptr=used_blocks if zero is None else zero,
        x_ptr=x,
        xp_ptr=xp,
        num_pairs=num_pairs,
        num_experts=num_experts,
        first_expert=first_expert,
        chain=index,
        chains=chains,
        num_blocks=num_blocks,
        num_zero=0 if zero is None else zero.numel(),
        num_rows=num_rows,
        x_cols=x_cols,
        stride_xt=x.stride(0),
        stride_pt=xp.stride(0),
        BLOCK_M=block_m,
        E_PAD=max(16, next_power_of_2(num_blocks if each_pair else num_experts)),
        BLOCK=block,
        PERMUTE=permute is not None,
        PERMUTE_T=rows,
        PERMUTE_K=PERMUTE_K,
        PDL=pdl,
        WGMMA=_wgmma_order(layout, x_cols),
        EACH_PAIR=each_pair,
        launch_pdl=pdl,
        num_warps=warps,
    )
    return route


def align_pairs_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, *, chunked_from: int = CHUNKED_ROUTE_PAIRS,
    chunk: int = ROUTE_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(sorted_ids, block_expert) of ``route_pairs``, for kernels that launch a program per block."""
    route = route_pairs(topk_ids, num_experts, block_m, chunked_from=chunked_from, chunk=chunk)
    return route.sorted_ids, route.block_expert


def routes_for(topk_ids: torch.Tensor, num_experts: int, cfg: MoeConfig) -> tuple[tuple, tuple]:
    """(gemm1's, gemm2's) ``align_pairs_by_expert`` routing for their block_m; sorted once when they agree."""
    route1 = align_pairs_by_expert(topk_ids, num_experts, cfg.gemm1.block_m)
    if cfg.gemm2.block_m == cfg.gemm1.block_m:
        return route1, route1
    return route1, align_pairs_by_expert(topk_ids, num_experts, cfg.gemm2.block_m)


def _wgmma_order(layout: str, k: int) -> bool:
    """Whether activations of K = ``k`` columns go in the K order of period 64 (weights in "kernel_wgmma")."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    period = activation_period(layout)
    if k % period:
        raise ValueError(f"{layout} layout: K must be a multiple of {period}, got {k}")
    return layout == "kernel_wgmma"


def prepare_activations(x: torch.Tensor, layout: str = "checkpoint") -> torch.Tensor:
    """[T, K] bf16/fp16 -> [T, K], same dtype, in the K order the GEMM kernels read for weights in ``layout``
    (``nvfp4.LAYOUTS``; ``sglang_glm5.kernels.nvfp4_moe``'s docstring): each group of 32 columns as
    [0, 4, .., 28, 1, 5, .., 31] (K % 32 == 0), or for "kernel_wgmma" column 64g + 16b + 8h + 4i + q at
    64g + 16q + 8h + 2b + i (K % 64 == 0)."""
    num_rows, k = x.shape
    wgmma = _wgmma_order(layout, k)
    xp = torch.empty((num_rows, k), dtype=x.dtype, device=x.device)
    rows = permute_rows(num_rows)
    _k.prepare_activations_kernel[(cdiv(num_rows, rows) * cdiv(k, PERMUTE_K),)](
        x_ptr=x, xp_ptr=xp, num_rows=num_rows, K=k, stride_xt=x.stride(0), stride_pt=xp.stride(0),
        BLOCK_T=rows, BLOCK_K=PERMUTE_K, WGMMA=wgmma,
    )  # fmt: skip
    return xp


# The top-k sum's programs (one per token and block of hidden columns): columns each, and warps. Narrower at a few
# tokens, where the sum is only a handful of programs (GLM-5 H = 6144: 6 a token at 1024 columns): 512 columns take
# the op 0.975-0.996x at B = 1-8 on the H200 (the sum 1.9 -> 1.4 us at TP8 B = 1); the same sums, bit-identical.
SUM_BLOCK_H = 1024
SUM_BLOCK_H_FEW = 512
SUM_FEW_TOKENS = 8
SUM_WARPS = 4


def sum_over_slots(
    y: torch.Tensor,
    topk_ids: torch.Tensor,
    out: torch.Tensor,
    num_experts: int,
    interpret: bool,
    row_map: torch.Tensor | None = None,
    *,
    pdl: bool = False,
) -> None:
    """out[t] = sum of y[row of pair t * k + j] over the slots j with a local expert (fp32, deterministic).

    The row of pair p is p, or row_map[p] ([T * k] int32) when given. A 3-d y [splits, rows, H] holds
    gemm2's split-K partials, added too (slots, then splits, in order). ``pdl`` as ``route_pairs``.
    """
    num_tokens, hidden = out.shape
    block_h = SUM_BLOCK_H_FEW if num_tokens <= SUM_FEW_TOKENS else SUM_BLOCK_H
    splits = y.shape[0] if y.dim() == 3 else 1
    _k.moe_sum_kernel[(num_tokens, cdiv(hidden, block_h))](
        y_ptr=y,
        topk_ids_ptr=topk_ids,
        row_map_ptr=row_map if row_map is not None else topk_ids,
        out_ptr=out,
        hidden_size=hidden,
        num_experts=num_experts,
        stride_ys=y.stride(0) if splits > 1 else 0,
        stride_yt=y.stride(-2),
        stride_ot=out.stride(0),
        TOP_K=topk_ids.shape[1],
        SPLITS=splits,
        BLOCK_H=block_h,
        HAS_ROW_MAP=row_map is not None,
        INTERPRETER=interpret,
        PDL=pdl,
        num_warps=SUM_WARPS,
        launch_pdl=pdl,
    )


# The small launches' pointer arguments and their element types, for ahead-of-time compiles (``aot_job``); every other
# argument is an i32, none assumed a multiple of 16 (a decode step's pair count is not).
_AOT_POINTERS = {
    "topk_ids_ptr": "*i32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "used_blocks_ptr": "*i32",
    "zero_ptr": "*i32", "x_ptr": "*bf16", "xp_ptr": "*bf16", "y_ptr": "*fp32", "row_map_ptr": "*i32",
    "out_ptr": "*bf16", "counts_ptr": "*i32",
}  # fmt: skip


def aot_job(kernel: str, consts: dict, arch: int, num_warps: int = 4) -> str:
    """One ahead-of-time compile of a small launch ("align": the routing, "count" and "place": the chunked routing's
    two, "sum": the top-k sum) for ``sm_{arch}`` (``sglang_glm5.aot`` worker; no GPU needed): its PTX. The op
    compiles these when it first runs."""
    from sglang_glm5.tiles import GemmConfig, compile_for_target

    fn = {"align": _k.moe_align_kernel, "count": _k.route_count_kernel, "place": _k.route_place_kernel,
          "sum": _k.moe_sum_kernel}[kernel]  # fmt: skip
    warps = GemmConfig(16, 64, 64, num_warps=num_warps, num_stages=1)  # only the warp count is read
    ints = {a for a in fn.arg_names if a not in consts and a not in _AOT_POINTERS}
    return compile_for_target(fn, consts, warps, arch, _AOT_POINTERS, ints).asm["ptx"]
