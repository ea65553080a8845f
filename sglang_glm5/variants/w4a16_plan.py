"""W4A16 grids: how many programs each GEMM of a call launches, and the rules a decode step runs by.

At decode a rank sees few active experts (GLM-5 sends a token to 8 of 256), so the programs of the active blocks
alone cannot fill the GPU: the K loop is then split (``plan_gemms``, from sizes known on the host, no sync). Beside
the grids: the launches that use programmatic dependent launch, where gemm2 waits for its routing block's h alone
(``awaits_blocks``) or fills gemm1's last wave (``overlaps_tail``), the chains (``expert_groups``), and the other
plans the tuner times for a tile (``split_candidates``).

The rules read their tunables from one frozen ``PlanSettings`` (``default_settings()``: the defaults and the
environment's switches, read once per process); an experiment or a test passes another one
(``dataclasses.replace(default_settings(), ...)``). ``call_plan`` gathers every rule's answer for one call of the op
(``CallPlan``), a pure function of the call's sizes, its tiles, the device's SM count and the settings, memoized on
exactly those. ``MODES`` names each mode a plan can take, the ``CallPlan`` field that records it, where it applies and
the settings that decide it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from sglang_glm5 import env, routing
from sglang_glm5._ints import cdiv
from sglang_glm5.routing import interpreting, num_blocks_bound, pdl_runs_on
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import MAX_SPLITS, GemmConfig, MoeConfig
from sglang_glm5.variants import Bucket, w4a16_gluon
from sglang_glm5.variants.w4a16_tiles import halvable, one_k_step_runs

# Programs per SM a split launch aims for (``PlanSettings.programs_per_sm``), and the offline pick's aim
# (``resident_aim``).
PROGRAMS_PER_SM = 2
# Programs per SM under which gemm2 halves its N tiles per program, where I takes few K steps (GLM-5 TP8, I = 256).
# H200, TP8 at real routing: aiming at 5 per SM instead of 2 takes B = 2-3 to two tiles a program and B = 4-6 to four
# (from four or eight): the op 0.960-0.994x at B = 2-6, the same bits. Not measured on SM120, whose 188 SMs reach the
# aim with fewer tiles a program.
MULTI_TILE_PROGRAMS_PER_SM = 5
# The op's launches that use programmatic dependent launch where a plan does (``CallPlan.pdl``).
PDL_LAUNCHES = ("route", "gemm1", "gemm2", "sum")


@dataclass(frozen=True)
class PlanSettings:
    """The tunables of the W4A16 plan. Tokens per expert are the call's pairs over the global experts (GLM-5: B / 32
    at B tokens a step); each threshold holds where it was measured on the H200 / H100 at GLM-5's real routing."""

    # Programs per SM a split launch aims for when its tile says nothing (``GemmConfig.programs_per_sm`` 0).
    programs_per_sm: int = PROGRAMS_PER_SM
    # Programs per SM under which gemm2 halves its N tiles per program (``plan_gemms``).
    multi_tile_programs_per_sm: int = MULTI_TILE_PROGRAMS_PER_SM
    # A program per possible routing block (no block loop, which costs the GEMMs 40-80 registers a thread) when their
    # number is at most this many times the blocks expected (``plan_launch``), up to ``whole_grid_pairs_per_expert``.
    # H200, GLM-5 EP8: 1.04-1.12x at B = 1-6 (bound / expected 5.8-8.6), 0.92-0.98x at B = 8-16 (2.9-4.6).
    whole_grid_within: float = 5.0
    whole_grid_pairs_per_expert: float = 8
    # A gemm1 config with ``stream`` runs as a stream-K schedule up to this many tokens per expert.
    stream_pairs_per_expert: float = 8
    # SGLANG_GLM5_PDL: the launches of PDL_LAUNCHES use programmatic dependent launch where the device runs it
    # (``routing.pdl_runs_on``), below ``pdl_below_tokens_per_expert`` (2-9% faster; 1-4% slower with busy
    # experts) and where gemm2 fills gemm1's tail.
    pdl: bool = True
    pdl_below_tokens_per_expert: float = 1
    # Below this many tokens per expert, where gemm2 walks several N tiles a program, gemm2's programs wait for their
    # routing block's h alone (``awaits_blocks``): TP8 B = 2-16 0.952-0.995x the op.
    await_blocks_below_tokens_per_expert: float = 1
    # From one token per expert up to this many, gemm2's programs fill gemm1's last wave (``overlaps_tail``): EP8 and
    # TP8 B = 32-256 0.95-1.00x the op.
    tail_overlap_max_tokens_per_expert: float = 8
    # Up to this many pairs (and at most E) the routing gives each pair a block of its own in one program
    # (``routing.route_pairs(each_pair=True)``); the same outputs.
    each_pair_max_pairs: int = 16
    # SGLANG_GLM5_TWO_CHAINS: within ``chains_tokens_per_expert`` (lowest, highest) the op runs as ``chains`` chains,
    # each over a share of the local experts on its share of the SMs, on streams of their own (``expert_groups``):
    # EP8 B = 4-16 0.91-0.97x the op; B = 1-3 and 32-256 no gain, TP8 mixed.
    two_chains: bool = True
    chains_tokens_per_expert: tuple[float, float] = (1 / 8, 1 / 2)
    chains: int = 2
    # Up to this many tokens per expert each chain takes every ``chains``-th active expert (counted on the GPU), above
    # it a contiguous group (``interleaves``): at EP8 B = 4-8 the busier half holds more experts than an even share.
    interleaved_tokens_per_expert: float = 1 / 4
    # Eager calls (no CUDA-graph capture) run the chains on every call; off: on a shape's first call only (which
    # loads their kernels for a later capture), one chain with the same K splits after that (``w4a16.run``): the
    # chains double an eager call's host time for a few microseconds of GPU time.
    eager_chains: bool = False
    # SGLANG_GLM5_GLUON_GEMM1: a tile marked ``gluon`` runs the Gluon kernel where it runs (``w4a16_gluon.applies``).
    gluon: bool = True
    # From this many pairs the routing is two launches over chunks of ``route_chunk`` pairs (``routing.route_pairs``).
    chunked_route_pairs: int = routing.CHUNKED_ROUTE_PAIRS
    route_chunk: int = routing.ROUTE_CHUNK

    def __post_init__(self) -> None:
        low, high = self.chains_tokens_per_expert
        if not 0 <= low <= high:
            raise ValueError(f"chains_tokens_per_expert: expected (low, high) with 0 <= low <= high, got "
                             f"{self.chains_tokens_per_expert}")  # fmt: skip
        if self.chains < 1 or self.programs_per_sm < 1 or self.route_chunk < 1:
            raise ValueError(f"chains, programs_per_sm, route_chunk: expected >= 1, got {self.chains}, "
                             f"{self.programs_per_sm}, {self.route_chunk}")  # fmt: skip

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PlanSettings:
        """The defaults with the environment's switches (``env.PDL``, ``env.TWO_CHAINS``, ``env.GLUON_GEMM1``)."""
        return cls(pdl=bool(env.get(env.PDL, environ)), two_chains=bool(env.get(env.TWO_CHAINS, environ)),
                   gluon=bool(env.get(env.GLUON_GEMM1, environ)))  # fmt: skip


@functools.cache
def default_settings() -> PlanSettings:
    """The settings the op plans by unless given others: ``PlanSettings.from_env()``, read on the first call."""
    return PlanSettings.from_env()


class Mode(NamedTuple):
    name: str
    field: str  # what records it in a ``CallPlan``
    where: str  # the calls it applies to
    settings: tuple[str, ...]  # the ``PlanSettings`` fields that decide it


MODES = (
    Mode("split K", "gemms.gemm*.splits", "few blocks for the SMs (decode)", ("programs_per_sm",)),
    Mode("whole grid", "gemms.gemm*.block_programs", "bound near the expected blocks",
         ("whole_grid_within", "whole_grid_pairs_per_expert")),
    Mode("multi-tile gemm2", "gemms.per_program", "I in a few K steps (TP8)", ("multi_tile_programs_per_sm",)),
    Mode("gemm2 halves", "(launch: HALVES)", "one N tile a program, a tile that halves", ()),
    Mode("stream-K gemm1", "gemms.gemm1.stream", "a tile with stream", ("stream_pairs_per_expert",)),
    Mode("PDL", "pdl", "sm_90+, few tokens or the tail overlap", ("pdl", "pdl_below_tokens_per_expert")),
    Mode("ready counters", "ready", "multi-tile gemm2 at decode", ("await_blocks_below_tokens_per_expert",)),
    Mode("tail overlap", "ready, gemms.gemm*.blocks_last", "1-8 tokens per expert, unsplit",
         ("tail_overlap_max_tokens_per_expert",)),
    Mode("each pair a block", "each_pair", "at most E and a few pairs", ("each_pair_max_pairs",)),
    Mode("chains", "chains, chain_experts, alone", "EP8 decode", ("two_chains", "chains_tokens_per_expert", "chains",
                                                                   "eager_chains")),
    Mode("interleaved chains", "interleaved", "the chains' smaller steps", ("interleaved_tokens_per_expert",)),
    Mode("Gluon", "gluon", "sm_90, a tile marked gluon", ("gluon",)),
    Mode("chunked routing", "(routing: two launches)", "prefill sizes", ("chunked_route_pairs", "route_chunk")),
)  # fmt: skip
# The tuner's trials (never read by a plan): programs per SM for the split plan below one token per expert (1 measured
# 5-7% faster than 2 at GLM-5 B = 8-16; 4 lets a tile of half the registers keep more warps in flight), and the
# targets ``tune --splits-only`` tries at each decode step beside the default.
SPLIT_TRIALS = (1, 4)
STEP_SPLIT_TRIALS = (1, 3, 4, 6, 8)
# The stream-K programs per SM the tuner tries for gemm1 below one token per expert (``split_candidates``; a config
# stores the winner as ``stream``): 0.93-0.95x the op at GLM-5 EP8 B = 4 and 16, 2-40% slower at the other sizes.
STREAM_TRIALS = (2, 3)
# The Gluon kernels (``w4a16_gluon``) are tuner candidates up to this many tokens per expert (GLM-5 B <= 256); above it
# the tuner times the leading Triton gemm1 tile in Gluon instead (``w4a16_gluon.prefill_forms``).
GLUON_MAX_BUCKET = 8
# Up to this many tokens per expert, where the GEMMs stream their weights, an offline pick keeps resident by shared
# memory the programs an SM each GEMM's grid is sized for (``resident_aim``).
RESIDENT_AIM_MAX_BUCKET = 8


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
    split: bool = True, whole_grid_within: float = 0.0, like: Launch | None = None,
    programs_per_sm: int = PROGRAMS_PER_SM,
) -> Launch:  # fmt: skip
    """The grid of one GEMM. K splits (if ``split``): ``like``'s when given, else ``cfg.split_k`` when set, else as
    many as it takes for the expected blocks times ``n_programs`` (N tiles or tile groups) to make
    ``cfg.programs_per_sm`` (``programs_per_sm`` when 0) per SM.

    Block programs: twice the expected blocks (and two more), at most the bound, so that a skewed
    routing costs a second pass of a few programs rather than a launch sized for the worst case. But when
    the bound is at most ``whole_grid_within`` times the expected blocks, a program per possible block (no
    block loop, which costs the GEMMs 40-80 registers a thread), the block axis last in the grid of a split
    launch, so that the idle programs launch after the working ones (``PlanSettings.whole_grid_within``).
    """
    if like is not None and split:
        splits, per_split = like.splits, like.k_per_split
    else:
        work = max(1.0, blocks_expected) * n_programs
        want = (cfg.split_k or math.ceil((cfg.programs_per_sm or programs_per_sm) * sms / work)) if split else 1
        splits, per_split = k_splits(k_size, cfg.block_k, want)
    programs = min(blocks_bound, math.ceil(2 * blocks_expected) + 2)
    if programs < blocks_bound <= whole_grid_within * max(1.0, blocks_expected):
        return Launch(blocks_bound, splits, per_split, blocks_last=splits > 1)
    return Launch(programs, splits, per_split)


class GemmPlan(NamedTuple):
    gemm1: Launch
    gemm2: Launch
    per_program: int  # gemm2's N tiles per program
    counters: int  # int32 counters gemm1 needs (0 without a split or a stream-K schedule)


def plan_gemms(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int, sms: int,
    like: GemmPlan | None = None, settings: PlanSettings | None = None,
) -> GemmPlan:  # fmt: skip
    """The grids of both GEMMs of one call, from sizes known on the host (no sync). ``like``: a plan of the same call
    whose K splits and gemm2's N tiles a program both GEMMs keep, and then no stream-K schedule (a chain's grids, sized
    for its share of the experts and SMs, with one chain's splits: each output summed in the same order, so the same
    bits). ``settings``: default ``default_settings()``."""
    settings = settings or default_settings()

    def blocks(gemm: GemmConfig) -> tuple[int, float]:
        bound = num_blocks_bound(num_pairs, num_experts, gemm.block_m)
        return bound, min(bound, expected_blocks(num_pairs, num_experts, num_global_experts, gemm.block_m))

    blocks1, blocks2 = blocks(cfg.gemm1), blocks(cfg.gemm2)
    tiles1 = cdiv(inter, cfg.gemm1.block_n)
    whole = num_pairs <= settings.whole_grid_pairs_per_expert * num_global_experts
    within = settings.whole_grid_within if whole else 0.0
    aim = settings.programs_per_sm
    launch1 = plan_launch(hidden, cfg.gemm1, tiles1, *blocks1, sms, whole_grid_within=within,
                          like=like and like.gemm1, programs_per_sm=aim)  # fmt: skip
    steps = cdiv(hidden, cfg.gemm1.block_k)
    stream = cfg.gemm1.stream * sms
    if (
        stream
        and like is None
        and num_pairs <= settings.stream_pairs_per_expert * num_global_experts
        and stream_fits(stream, blocks1[0] * tiles1 * steps)
    ):
        launch1 = Launch(blocks1[0], 1, steps * cfg.gemm1.block_k, stream=stream)  # else the planned grid
    tiles2 = cdiv(hidden, cfg.gemm2.block_n)
    if like is not None:  # its tiles a program, and so whether gemm2 may split at all
        per_program = like.per_program
    else:
        per_program = gemm2_tiles_per_program(inter, cfg.gemm2)
        least = 2 if cfg.gemm2.one_k_step else 1  # a one-step tile runs only with several N tiles a program
        aim2 = settings.multi_tile_programs_per_sm * sms
        while per_program > least and blocks2[1] * cdiv(tiles2, per_program) < aim2:
            per_program //= 2  # few blocks: keep the programs that fill the GPU
    launch2 = plan_launch(inter, cfg.gemm2, cdiv(tiles2, per_program), *blocks2, sms, split=per_program == 1,
                          whole_grid_within=within, like=like and like.gemm2, programs_per_sm=aim)  # fmt: skip
    counters = blocks1[0] * tiles1 if launch1.splits > 1 or launch1.stream else 0
    return GemmPlan(launch1, launch2, per_program, counters)


def awaits_blocks(
    cfg: MoeConfig, plan: GemmPlan, num_pairs: int, num_global_experts: int, dependent: bool,
    settings: PlanSettings | None = None,
) -> bool:  # fmt: skip
    """Whether gemm2's programs wait for their routing block's h alone (per-block ready counters that gemm1 fills)
    rather than for the whole of gemm1: below ``settings.await_blocks_below_tokens_per_expert``, where gemm2 is a
    ``dependent`` launch (PDL; or the interpreter, which runs the same kernels in order) walking several N tiles a
    program (a few programs a block, each with a long chain to start), both GEMMs on one routing (the same block_m)
    and gemm1 on a planned grid (not stream-K)."""
    return (
        dependent
        and num_pairs < (settings or default_settings()).await_blocks_below_tokens_per_expert * num_global_experts
        and plan.per_program > 1
        and cfg.gemm1.block_m == cfg.gemm2.block_m
        and not plan.gemm1.stream
    )


def overlaps_tail(
    cfg: MoeConfig, plan: GemmPlan, num_pairs: int, num_global_experts: int, dependent: bool,
    settings: PlanSettings | None = None,
) -> bool:  # fmt: skip
    """Whether gemm2's programs fill gemm1's last wave: from one token per expert up to
    ``settings.tail_overlap_max_tokens_per_expert``, where gemm2 is a ``dependent`` launch (PDL; or the interpreter,
    which runs the same kernels in order), both GEMMs on one routing (the same block_m), unsplit, and gemm1 on a planned
    grid (not stream-K). The op then launches with PDL, both grids with the block axis last, and gemm2 waiting for each
    block's ready counter."""
    most = (settings or default_settings()).tail_overlap_max_tokens_per_expert * num_global_experts
    return (
        dependent
        and num_global_experts <= num_pairs <= most
        and cfg.gemm1.block_m == cfg.gemm2.block_m
        and plan.gemm1.splits == 1
        and plan.gemm2.splits == 1
        and not plan.gemm1.stream
    )


def expert_groups(
    num_pairs: int, num_experts: int, num_global_experts: int, one_launch_routing: bool, gemm2_tiles_a_program: int,
    settings: PlanSettings | None = None,
) -> int:  # fmt: skip
    """1, or ``settings.chains`` where the op runs as that many chains, each over that share of the local experts (an
    equal group, or every n-th active expert: ``interleaves``): with ``settings.two_chains``, within
    ``settings.chains_tokens_per_expert``, for an expert count the chains divide, a routing of one launch (below
    ``settings.chunked_route_pairs`` pairs) and gemm2 one N tile a program (``gemm2_tiles_per_program``; where it
    walks several, its programs already wait for their own block's h alone: ``awaits_blocks``). Off a GPU (the
    interpreter) the op runs the chains one after the other."""
    settings = settings or default_settings()
    chains = settings.chains
    if not settings.two_chains or chains < 2 or num_experts % chains or not one_launch_routing:
        return 1
    if gemm2_tiles_a_program != 1:
        return 1
    low, high = settings.chains_tokens_per_expert
    return chains if low <= num_pairs / num_global_experts <= high else 1


def interleaves(num_pairs: int, num_global_experts: int, settings: PlanSettings | None = None) -> bool:
    """Whether the chains of a call with ``num_pairs`` (token, slot) pairs each take every n-th active expert rather
    than a contiguous group (``settings.interleaved_tokens_per_expert``)."""
    return num_pairs <= (settings or default_settings()).interleaved_tokens_per_expert * num_global_experts


def chain_sms(sms: int, chains: int) -> int:
    """The SMs a chain's grids are sized for: its share (the chains side by side on parts of the GPU, 0.92-0.96x the
    op at EP8 B = 4-16 against 0.95-1.00x with each sized for the whole GPU), at least one."""
    return max(1, sms // chains)


def in_tail_order(plan: GemmPlan) -> GemmPlan:
    """``plan`` with both grids' block axis last, as the op runs it where ``overlaps_tail`` (and the tuner times it)."""
    return plan._replace(gemm1=dataclasses.replace(plan.gemm1, blocks_last=True),
                         gemm2=dataclasses.replace(plan.gemm2, blocks_last=True))  # fmt: skip


def stream_fits(programs: int, units: int) -> bool:
    """Whether a stream-K schedule of ``programs`` over at most ``units`` work units (blocks x N tiles x K steps)
    keeps the kernel's int32 unit arithmetic (program x units) in range."""
    return programs * units < 2**31


# gemm2 tiles in their one-K-step form (``GemmConfig.one_k_step``), which the tuner times beside its leading tiles
# above ONE_STEP_ABOVE_BUCKET tokens per expert (as search_space's 256-deep 8-warp tiles) where I is one step of them
# and H makes two N tiles or more: routing blocks of 128 pairs, as gemm1's chunked-prefill tiles (so one routing serves
# both GEMMs), which the forms that loop over K do not fit on sm_90 at 3 stages. H200, GLM-5 TP8 B = 8192: the tuner's
# pick, 128x128x256-w8-s4-1k, takes the op to 0.958x its time with 64x256x256-w8-s3 and two routings.
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
    steps = cdiv(k_size, block_k)
    per_split = cdiv(steps, max(1, min(steps, want, MAX_SPLITS)))
    return cdiv(steps, per_split), per_split * block_k


def gemm2_tiles_per_program(inter: int, cfg: GemmConfig) -> int:
    """N tiles per gemm2 program: as many as fit in 8 K steps (one when a tile alone takes 5 or more).

    Measured on the H200: with I = 256 (GLM-5 TP8: one or two
    K steps) 4-8 tiles per program made gemm2 5-29% faster; with I = 2048 (EP8: 8-32 steps) one tile
    per program was 1-9% faster than several.
    """
    return max(1, 8 // cdiv(inter, cfg.block_k))


def resident_aim(kernel: str, cfg: GemmConfig, shape: MoeShape, bucket: Bucket) -> int:
    """Programs an SM the launch plan sizes a decode GEMM's grid for, which a tile picked without timing it should
    hold resident by shared memory (``tuner``'s offline pick): gemm2 walking several N tiles a program (I in a few K
    steps: GLM-5 TP8) ``MULTI_TILE_PROGRAMS_PER_SM``, else a split step's ``PROGRAMS_PER_SM``; 0 (no aim) above
    ``RESIDENT_AIM_MAX_BUCKET`` tokens per expert."""
    if bucket > RESIDENT_AIM_MAX_BUCKET:
        return 0
    if kernel == "gemm2" and gemm2_tiles_per_program(shape.inter, cfg) > 1:
        return MULTI_TILE_PROGRAMS_PER_SM
    return PROGRAMS_PER_SM


def halves(cfg: GemmConfig, per_program: int) -> bool:
    """Whether gemm2 computes each N tile as two halves, one after the other (the decoded weights of one half in
    registers at a time: sm_90, 16x128x256-w4-s3 147 registers a thread against 228, 3 programs an SM instead of 2):
    one tile per program, a tile that can."""
    return per_program == 1 and halvable(cfg)


@dataclass(frozen=True)
class CallPlan:
    """What one call of the W4A16 op launches (``w4a16.run``), decided on the host from its sizes, tiles, device and
    settings alone, never from tensor values: every call of the same shape gets the same plan (``call_plan``)."""

    chains: int  # 1, or PlanSettings.chains (``expert_groups``), each over chain_experts of the local experts
    chain_experts: int
    interleaved: bool  # each chain takes every n-th active expert (``interleaves``), else a contiguous group
    gemms: GemmPlan  # each chain's grids (``plan_gemms`` for its share of the experts and the SMs)
    pdl: frozenset[str]  # the launches of PDL_LAUNCHES that use programmatic dependent launch
    ready: int  # per-block ready counters a chain needs: gemm2 waits for its block's h alone; 0: for all of gemm1
    ready_tiles: int  # gemm1's N tiles a block: what a block's ready counter reaches
    each_pair: bool  # the routing gives each pair a block of its own (``routing.route_pairs``)
    gluon: tuple[bool, bool]  # (gemm1, gemm2) run in Gluon (``w4a16_gluon.applies``)
    # with chains: the same call as one chain, with the same K splits (so the same bits), for eager calls
    # (``w4a16.run``: chains double an eager call's launches for a few microseconds of GPU time)
    alone: CallPlan | None = None


def plan_call(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str, sms: int, settings: PlanSettings | None = None,
) -> CallPlan:  # fmt: skip
    """The plan of one call on ``device`` (``sms`` SMs): the rules above, applied in the order the op launches by
    (chains, grids, PDL, the wait for gemm1, the routing's form). With chains, each chain's grids are sized for its
    share of the experts and SMs but keep one chain's K splits, and the plan carries one chain's (``alone``): the
    chains change where the programs run, never the bits. A stream-K gemm1, whose segments follow its program count
    and the blocks in use, keeps one chain."""
    settings = settings or default_settings()
    chains = expert_groups(num_pairs, num_experts, num_global_experts, num_pairs < settings.chunked_route_pairs,
                           gemm2_tiles_per_program(inter, cfg.gemm2), settings)  # fmt: skip
    whole = plan_gemms(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, sms, settings=settings)
    rules = (cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout, settings)
    alone = _launch_rules(*rules, 1, whole)
    if chains == 1 or whole.gemm1.stream:
        return alone
    share = plan_gemms(cfg, num_pairs, num_experts // chains, num_global_experts, hidden, inter,
                       chain_sms(sms, chains), like=whole, settings=settings)  # fmt: skip
    return dataclasses.replace(_launch_rules(*rules, chains, share), alone=alone)


def _launch_rules(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str, settings: PlanSettings, chains: int, plan: GemmPlan,
) -> CallPlan:  # fmt: skip
    """``plan_call``'s answer for ``chains`` chains on grids ``plan``: PDL, the wait for gemm1, the routing's form."""
    interpret = interpreting()
    chain_experts = num_experts // chains
    interleaved = chains > 1 and interleaves(num_pairs, num_global_experts, settings)
    may_pdl = settings.pdl and pdl_runs_on(device)
    gluon = (w4a16_gluon.applies(device, layout, hidden, cfg.gemm1, dtype, allowed=settings.gluon),
             w4a16_gluon.applies(device, layout, inter, cfg.gemm2, dtype, allowed=settings.gluon))  # fmt: skip
    tail = not gluon[1] and overlaps_tail(cfg, plan, num_pairs, num_global_experts, may_pdl or interpret, settings)
    if tail:  # a block's N tiles side by side in both GEMMs
        plan = in_tail_order(plan)
    below = num_pairs < settings.pdl_below_tokens_per_expert * num_global_experts
    pdl = frozenset(PDL_LAUNCHES) if may_pdl and (below or tail) else frozenset()
    awaits = tail or (
        not gluon[1] and awaits_blocks(cfg, plan, num_pairs, num_global_experts, "gemm2" in pdl or interpret, settings)
    )
    return CallPlan(
        chains=chains,
        chain_experts=chain_experts,
        interleaved=interleaved,
        gemms=plan,
        pdl=pdl,
        ready=num_blocks_bound(num_pairs, chain_experts, cfg.gemm1.block_m) if awaits else 0,
        ready_tiles=cdiv(inter, cfg.gemm1.block_n),
        each_pair=num_pairs <= min(settings.each_pair_max_pairs, chain_experts) and not interleaved,
        gluon=gluon,
    )


# Plans remembered per process (a server calls with a few shapes per layer shape; beyond this many, the least recently
# used are planned again).
MEMO_PLANS = 4096


def call_plan(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str, settings: PlanSettings | None = None,
) -> CallPlan:  # fmt: skip
    """``plan_call`` for a call on ``device`` with ``settings`` (default ``default_settings()``), remembered per
    distinct call: the key is what the plan is a function of (the arguments, the interpreter switch, the device's
    index and SM count; a device's architecture is its index's). Working the rules out takes tens of microseconds of
    an eager call's host time."""
    interpret = interpreting()
    index = None
    if device.type == "cuda" and not interpret:
        index = device.index if device.index is not None else torch.cuda.current_device()
        device = torch.device("cuda", index)
    return planned(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout,
                       sm_count(index), settings or default_settings(), interpret)  # fmt: skip


@functools.lru_cache(maxsize=MEMO_PLANS)
def planned(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str, sms: int, settings: PlanSettings, interpret: bool,
) -> CallPlan:  # fmt: skip
    """``plan_call``, memoized on its arguments and the interpreter switch (``interpret``, which the rules read):
    ``call_plan``'s memo."""
    return plan_call(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout, sms,
                     settings)  # fmt: skip
