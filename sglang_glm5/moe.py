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

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from sglang_glm5 import prefill
from sglang_glm5.kernels import nvfp4_moe as _k
from sglang_glm5.routing import (
    Route,
    check_ids_in_range,
    interpreting,
    num_blocks_bound,
    route_pairs,
    sum_over_slots,
    validate_call,
)
from sglang_glm5.tiles import MAX_SPLITS, GemmConfig, MoeConfig, check_w4a16_config, heuristic_config
from sglang_glm5.weights import Nvfp4MoeWeights

# ---------------------------------------------------------------------------------------------
# How many programs: at decode a rank sees few active experts (GLM-5 sends a token to 8 of 256), so
# the programs of the active blocks alone cannot fill the GPU; the K loop is then split.


# Programs per SM a launch aims for: below it the K loop is split (if it has steps to split).
PROGRAMS_PER_SM = 2


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
    """Grid of one GEMM: block programs (each walks the used blocks b, b + programs, ...) and K splits."""

    block_programs: int
    splits: int
    k_per_split: int  # K elements per split, a multiple of block_k


def plan_launch(
    k_size: int, cfg: GemmConfig, n_programs: int, blocks_bound: int, blocks_expected: float, sms: int,
    split: bool = True,
) -> Launch:  # fmt: skip
    """The grid of one GEMM. K splits (if ``split``): ``cfg.split_k`` when set, else as many as it takes
    for the expected blocks times ``n_programs`` (N tiles or tile groups) to make PROGRAMS_PER_SM per SM.

    Block programs: twice the expected blocks (and two more), at most the bound, so that a skewed
    routing costs a second pass of a few programs rather than a launch sized for the worst case.
    """
    work = max(1.0, blocks_expected) * n_programs
    want = (cfg.split_k or math.ceil(PROGRAMS_PER_SM * sms / work)) if split else 1
    programs = min(blocks_bound, math.ceil(2 * blocks_expected) + 2)
    return Launch(programs, *k_splits(k_size, cfg.block_k, want))


class GemmPlan(NamedTuple):
    gemm1: Launch
    gemm2: Launch
    per_program: int  # gemm2's N tiles per program
    counters: int  # int32 split-K counters gemm1 needs (0 without a split)


def plan_gemms(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int, sms: int
) -> GemmPlan:
    """The grids of both GEMMs of one call, from sizes known on the host (no sync)."""

    def blocks(gemm: GemmConfig) -> tuple[int, float]:
        bound = num_blocks_bound(num_pairs, num_experts, gemm.block_m)
        return bound, min(bound, expected_blocks(num_pairs, num_experts, num_global_experts, gemm.block_m))

    blocks1, blocks2 = blocks(cfg.gemm1), blocks(cfg.gemm2)
    tiles1 = triton.cdiv(inter, cfg.gemm1.block_n)
    launch1 = plan_launch(hidden, cfg.gemm1, tiles1, *blocks1, sms)
    tiles2 = triton.cdiv(hidden, cfg.gemm2.block_n)
    per_program = gemm2_tiles_per_program(inter, cfg.gemm2)
    while per_program > 1 and blocks2[1] * triton.cdiv(tiles2, per_program) < PROGRAMS_PER_SM * sms:
        per_program //= 2  # few blocks: keep the programs that fill the GPU
    launch2 = plan_launch(inter, cfg.gemm2, triton.cdiv(tiles2, per_program), *blocks2, sms, split=per_program == 1)
    counters = blocks1[0] * tiles1 if launch1.splits > 1 else 0
    return GemmPlan(launch1, launch2, per_program, counters)


def k_splits(k_size: int, block_k: int, want: int) -> tuple[int, int]:
    """(splits, K elements per split) for at most ``want`` splits (and MAX_SPLITS) of whole K steps, none empty."""
    steps = triton.cdiv(k_size, block_k)
    per_split = triton.cdiv(steps, max(1, min(steps, want, MAX_SPLITS)))
    return triton.cdiv(steps, per_split), per_split * block_k


def _check_launch(launch: Launch, cfg: GemmConfig, k_size: int) -> None:
    if launch.k_per_split % cfg.block_k or not 0 <= (launch.splits - 1) * launch.k_per_split < k_size:
        raise ValueError(f"launch: {launch} leaves a K split empty or cuts a K step (K = {k_size}, {cfg.label})")


# ---------------------------------------------------------------------------------------------
# The op.


_caches: dict[int, object] = {}


def pick_config(tokens_per_expert: float, num_experts: int, hidden: int, inter: int, device: torch.device) -> MoeConfig:
    """The config for this call: the autotune cache of this GPU when it knows the shape, else the heuristic.

    The cache is read once per device and its answers are memoized, so a call costs a dict lookup.
    """
    if device.type != "cuda":
        return heuristic_config(tokens_per_expert)
    from sglang_glm5.autotune import ConfigCache
    from sglang_glm5.hardware import detect
    from sglang_glm5.shapes import MoeShape

    index = device.index if device.index is not None else torch.cuda.current_device()
    cache = _caches.get(index)
    if cache is None:
        cache = _caches[index] = ConfigCache(detect(index))
    return cache.lookup(MoeShape(num_experts, hidden, inter), tokens_per_expert)


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
        num_global_experts=num_global_experts,
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
) -> torch.Tensor:
    """``nvfp4_fused_moe`` on a layer's checked weights (``Nvfp4MoeWeights.build``).

    config: tiles for the W4A16 kernels (default: the autotune cache, else the heuristic); with
    path="auto" a config also keeps the call on those kernels (no W4A4, no dense prefill).
    path: "w4a16" (NVFP4 weights, 16-bit activations), "w4a4" (SM12x only: activations quantized to
    NVFP4 with the weights' input scales, block-scaled FP4 tensor cores), or "auto" (``w4a4_select.resolve_path``).
    check_ids: raise on expert ids outside [-1, E). Costs a device-to-host sync per call (skipped
    during CUDA-graph capture); callers whose ids are valid by construction turn it off.
    num_global_experts: experts across all ranks, when the ids mark other ranks' experts -1 (expert
    parallelism). Tiles and paths are chosen by tokens per expert, estimated without a sync as
    T * k / num_global_experts (default E: every slot local).
    """
    num_tokens, top_k = validate_call(hidden_states, weights, topk_weights, topk_ids)
    num_experts, hidden, inter = weights.shape
    out = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=hidden_states.device)
    if num_tokens == 0:
        return out
    if check_ids:
        check_ids_in_range(topk_ids, num_experts)
    if config is not None and not isinstance(config, MoeConfig):
        raise TypeError(f"config: expected MoeConfig or None, got {type(config).__name__}")
    num_pairs = num_tokens * top_k
    if num_global_experts is not None and (not isinstance(num_global_experts, int) or num_global_experts < num_experts):
        raise ValueError(
            f"num_global_experts: expected an int >= the {num_experts} local experts, got {num_global_experts!r}"
        )
    tokens_per_expert = num_pairs / (num_global_experts or num_experts)
    if path != "w4a16" and not (path == "auto" and config is not None):  # a config is for the W4A16 kernels
        from sglang_glm5.w4a4_select import resolve_path

        chosen = resolve_path(path, hidden_states.device, tokens_per_expert, weights.shape,
                              has_input_scales=weights.has_input_scales)  # fmt: skip
        if chosen == "w4a4":
            from sglang_glm5.w4a4 import run_w4a4

            return run_w4a4(hidden_states, weights, topk_weights, topk_ids, out=out,
                            num_global_experts=num_global_experts)  # fmt: skip
    interpret = interpreting()
    topk_ids = topk_ids.contiguous()
    if config is None and not interpret and _dense_prefill(hidden_states.device, tokens_per_expert):
        return prefill.dense_moe(hidden_states, weights, topk_weights, topk_ids, out=out)
    cfg = config or pick_config(tokens_per_expert, num_experts, hidden, inter, hidden_states.device)
    device = hidden_states.device
    sms = sm_count(None if interpret else (device.index if device.index is not None else torch.cuda.current_device()))
    num_global = num_global_experts or num_experts

    plan = plan_gemms(cfg, num_pairs, num_experts, num_global, hidden, inter, sms)
    launch1, launch2, per_program = plan.gemm1, plan.gemm2, plan.per_program
    counters = torch.empty(plan.counters, dtype=torch.int32, device=device) if plan.counters else None
    xp = torch.empty((num_tokens, hidden), dtype=hidden_states.dtype, device=device)  # x in the GEMMs' K order
    route1 = route_pairs(topk_ids, num_experts, cfg.gemm1.block_m, zero=counters, permute=(hidden_states, xp))
    route2 = route1 if cfg.gemm2.block_m == cfg.gemm1.block_m else route_pairs(topk_ids, num_experts, cfg.gemm2.block_m)

    h = torch.empty((num_pairs, inter), dtype=hidden_states.dtype, device=device)
    gate_row0, up_row0 = weights.gate_up_rows
    launch_gemm1(xp, weights.w13, weights.w13_scale, weights.w13_scale_2, route1, h, cfg.gemm1, top_k, gate_row0,
                 up_row0, interpret, launch=launch1, counters=counters)  # fmt: skip
    if launch2.splits > 1:
        y = torch.empty((launch2.splits, num_pairs, hidden), dtype=torch.float32, device=device)
    else:
        y = torch.empty((num_pairs, hidden), dtype=hidden_states.dtype, device=device)
    launch_gemm2(h, weights.w2, weights.w2_scale, weights.w2_scale_2, topk_weights.reshape(-1).contiguous(),
                 route2, y, cfg.gemm2, interpret, per_program=per_program, launch=launch2)  # fmt: skip
    sum_over_slots(y, topk_ids, out, num_experts, interpret)
    return out


def _whole_grid(route: Route, cfg: GemmConfig, k_size: int) -> Launch:
    """One block program per possible block, no split: the grid of a launch that was not planned."""
    return Launch(route.block_expert.numel(), 1, triton.cdiv(k_size, cfg.block_k) * cfg.block_k)


def launch_gemm1(
    x, w13, w13_scale, gs13, route: Route, h, cfg: GemmConfig, top_k, gate_row0, up_row0, interpret,
    *, launch: Launch | None = None, counters: torch.Tensor | None = None,
):  # fmt: skip
    """gemm1 into h [P, I]. ``launch`` (default: a program per possible block, no split) with splits > 1
    needs ``counters``: int32, at least num_blocks * N tiles, zeroed (``route_pairs(zero=...)``)."""
    num_pairs, inter = h.shape
    check_w4a16_config(cfg)
    launch = launch or _whole_grid(route, cfg, x.shape[1])
    _check_launch(launch, cfg, x.shape[1])
    tiles = triton.cdiv(inter, cfg.block_n)
    split = launch.splits > 1
    part = None
    if split:
        if counters is None or counters.numel() < route.block_expert.numel() * tiles:
            raise ValueError(f"counters: a split gemm1 needs {route.block_expert.numel() * tiles} zeroed int32")
        part = torch.empty((launch.splits, num_pairs, 2, inter), dtype=torch.float32, device=h.device)
    w13 = w13.view(torch.int16)  # 4 nibbles per element (kernels/nvfp4_moe.py)
    _k.nvfp4_moe_gemm1_kernel[(launch.block_programs, tiles, launch.splits)](
        x_ptr=x,
        w_ptr=w13,
        ws_ptr=w13_scale.view(torch.uint8),
        wgs_ptr=gs13,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        part_ptr=part if split else h,
        counter_ptr=counters if split else route.used_blocks,
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
        BLOCK_LOOP=launch.block_programs < route.block_expert.numel(),
        INTERPRETER=interpret,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def gemm2_tiles_per_program(inter: int, cfg: GemmConfig) -> int:
    """N tiles per gemm2 program: as many as fit in 8 K steps (one when a tile alone takes 5 or more).

    Measured on the H200 (bench/h200/runs/exp_flat_loop*.json): with I = 256 (GLM-5 TP8: one or two
    K steps) 4-8 tiles per program made gemm2 5-29% faster; with I = 2048 (EP8: 8-32 steps) one tile
    per program was 1-9% faster than several.
    """
    return max(1, 8 // triton.cdiv(inter, cfg.block_k))


def launch_gemm2(
    h, w2, w2_scale, gs2, topk_weights_flat, route: Route, y, cfg: GemmConfig, interpret,
    per_program=None, *, launch: Launch | None = None,
):  # fmt: skip
    """gemm2 into y: [P, H] in the hidden states' dtype, or with ``launch.splits`` > 1 the fp32
    partials [splits, P, H] that ``sum_over_slots`` adds. ``per_program``: N tiles per program (>= 1);
    None = ``gemm2_tiles_per_program``; several tiles per program and a split K exclude each other."""
    hidden = y.shape[-1]
    num_pairs = h.shape[0]
    check_w4a16_config(cfg)
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
    want = (launch.splits, num_pairs, hidden) if split else (num_pairs, hidden)
    if tuple(y.shape) != want or (split and y.dtype != torch.float32):
        raise ValueError(f"y: expected shape {list(want)}{' fp32' if split else ''}, got {list(y.shape)} {y.dtype}")
    _k.nvfp4_moe_gemm2_kernel[(launch.block_programs, triton.cdiv(tiles, per_program), launch.splits)](
        h_ptr=h,
        w_ptr=w2,
        ws_ptr=w2_scale.view(torch.uint8),
        wgs_ptr=gs2,
        topk_weights_ptr=topk_weights_flat,
        sorted_ids_ptr=route.sorted_ids,
        block_expert_ptr=route.block_expert,
        used_blocks_ptr=route.used_blocks,
        y_ptr=y,
        num_pairs=num_pairs,
        hidden_size=hidden,
        inter_size=h.shape[1],
        k_per_split=launch.k_per_split,
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
        SPLITS=launch.splits,
        BLOCK_LOOP=launch.block_programs < route.block_expert.numel(),
        INTERPRETER=interpret,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
