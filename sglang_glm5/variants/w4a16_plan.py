"""W4A16 grids: how many programs each GEMM of a call launches, and the rules a decode step runs by.

At decode a rank sees few active experts (GLM-5 sends a token to 8 of 256), so the programs of the active blocks
alone cannot fill the GPU: the K loop is then split (``plan_gemms``, from sizes known on the host, no sync). Beside
the grids: the launches that use programmatic dependent launch, where gemm2 waits for its routing block's h alone
(``awaits_blocks``) or fills gemm1's last wave (``overlaps_tail``), and the other plans the tuner times for a tile
(``split_candidates``). Each rule's constant says where it was measured. ``call_plan`` gathers every rule's answer for
one call of the op (``CallPlan``), once per distinct call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch

from sglang_glm5 import env, routing
from sglang_glm5._ints import cdiv
from sglang_glm5.routing import interpreting, num_blocks_bound, uses_pdl
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import MAX_SPLITS, GemmConfig, MoeConfig
from sglang_glm5.variants import Bucket, w4a16_gluon
from sglang_glm5.variants.w4a16_tiles import halvable, one_k_step_runs

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
# Up to this many tokens per expert (GLM-5 decode, B <= 256), where the GEMMs stream their weights, an offline pick
# keeps resident by shared memory the programs an SM each GEMM's grid is sized for (``resident_aim``).
RESIDENT_AIM_MAX_BUCKET = 8
# Tokens per expert of the routing (lowest, highest; None: never) for which the op runs as two chains, each over part of
# the local experts (``INTERLEAVED_TOKENS_PER_EXPERT``: every other active expert, or a half), on two CUDA streams
# (``expert_groups``): each chain's routing, gemm1 and gemm2 beside the other's, so that one chain's launch ramps, tails
# and waits overlap the other's work; one top-k sum adds both. Only where gemm2 walks one N tile a program: elsewhere (I
# short, GLM-5 TP8) its programs already wait for their own block's h alone (``awaits_blocks``). H100, GLM-5 at real
# routing, seeds 43 / 67, against one chain on the same inputs (bench/README.md, run 48): EP8 B = 4, 6, 8, 10, 12, 14,
# 16 0.968 / 0.948, 0.940 / 0.933, 0.932 / 0.913, 0.973 / 0.976, 0.935 / 0.932, 0.933 / 0.927, 0.930 / 0.919x the op, B
# = 5 0.960 / 1.014x (B = 7, 9, 11, 13, 15 not timed); B = 1-3 1.00-1.06x, B = 32, 64, 128, 256 1.022, 0.996, 1.085,
# 1.081x; TP8 0.957-0.975x at B = 4, 8 and 10, 1.005-1.146x at B = 5, 6, 12, 14 and 16.
TWO_CHAINS_TOKENS_PER_EXPERT: tuple[float, float] | None = (1 / 8, 1 / 2)
# Chains in that span: CHAINS of them, each over a CHAINS-th of the local experts (an equal group, or every CHAINS-th
# active expert), the first on the caller's stream and the others on streams of their own. With CHAIN_SM_SHARE each
# chain's grids are sized for its share of the SMs (the chains side by side on parts of the GPU) rather than for the
# whole GPU (the chains filling each other's gaps). H200, GLM-5 EP8 at real routing, seed 43, against one chain on the
# same inputs (bench/README.md, run 49): two chains on SM shares 0.964 / 0.930 / 0.920x at B = 4 / 8 / 16, on the whole
# GPU 0.995 / 0.958 / 0.949x, four chains on SM shares 0.966 / 0.925 / 0.915x, four on the whole GPU 1.04-1.46x; B = 2
# (outside the span) 1.06x on SM shares.
CHAINS = 2
CHAIN_SM_SHARE = True
# Which experts a chain takes: up to this many tokens per expert every CHAINS-th expert of those the step's ids touch
# (counted on the GPU by each chain's routing launch, so the chains share the active experts out evenly whichever they
# are; the weights whole), above it contiguous groups (the halves: its weights a slice, its ids shifted); 0: always the
# halves, inf: always interleaved. At GLM-5 EP8 B = 8 (about 7 of 32 experts active, uniform routing) the busier half
# holds 4.5 experts on average, an even share 3.8 (a count; B = 4: 2.6 against 2.2, B = 16: 7.5 against 6.6). Timed
# against the halves, round-robin from CUDA graphs (bench/README.md, run 50), interleaved over one chain's time / the
# halves': H200 seed 43 B = 4 0.924 / 0.963, B = 8 0.913 / 0.922, B = 12 0.974 / 0.968, B = 16 0.922 / 0.915; H100 seeds
# 43, 67 B = 4 0.915 / 0.958, 0.913 / 0.947, B = 8 0.904 / 0.916, 0.904 / 0.911, B = 16 0.937 / 0.923, 0.931 / 0.924:
# the gain where few experts are active (when one chain ends its SMs take the other's programs, so an uneven split costs
# less than its expert count), a loss at B = 16.
INTERLEAVED_TOKENS_PER_EXPERT = 1 / 4
# Chains also where gemm2 walks several N tiles a program (GLM-5 TP8), each chain with its own ready counters: for
# the experiments (run 48 measured two chains there at 0.96-1.15x the op, whole GPU each).
CHAINS_MULTI_TILE_GEMM2 = False
# Whether eager calls (no CUDA-graph capture) run the chains on every call; False: only on the first call of each
# shape on a device (which loads their kernels for a later capture), one chain with the same K splits after that
# (``w4a16._eager_plan``). An eager call is its host's time: at GLM-5 EP8 B = 8 the chains took an H100 host 0.53-0.68
# ms a call against 0.27-0.40 ms for one chain at other sizes (bench/README.md, runs 51-52), for a few microseconds
# of GPU time. The chains' own tests and the A/B experiments (``bench/exp/decode_cases.compare_variants``) set it.
EAGER_CHAINS = False


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
) -> Launch:  # fmt: skip
    """The grid of one GEMM. K splits (if ``split``): ``like``'s when given, else ``cfg.split_k`` when set, else as
    many as it takes for the expected blocks times ``n_programs`` (N tiles or tile groups) to make
    ``cfg.programs_per_sm`` (PROGRAMS_PER_SM when 0) per SM.

    Block programs: twice the expected blocks (and two more), at most the bound, so that a skewed
    routing costs a second pass of a few programs rather than a launch sized for the worst case. But when
    the bound is at most ``whole_grid_within`` times the expected blocks, a program per possible block (no
    block loop, which costs the GEMMs 40-80 registers a thread), the block axis last in the grid of a split
    launch, so that the idle programs launch after the working ones (``WHOLE_GRID_WITHIN``).
    """
    if like is not None and split:
        splits, per_split = like.splits, like.k_per_split
    else:
        work = max(1.0, blocks_expected) * n_programs
        want = (cfg.split_k or math.ceil((cfg.programs_per_sm or PROGRAMS_PER_SM) * sms / work)) if split else 1
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
    like: GemmPlan | None = None,
) -> GemmPlan:  # fmt: skip
    """The grids of both GEMMs of one call, from sizes known on the host (no sync). ``like``: a plan of the same call
    whose K splits and gemm2's N tiles a program both GEMMs keep, and then no stream-K schedule (a chain's grids, sized
    for its share of the experts and SMs, with one chain's splits: each output summed in the same order, so the same
    bits)."""

    def blocks(gemm: GemmConfig) -> tuple[int, float]:
        bound = num_blocks_bound(num_pairs, num_experts, gemm.block_m)
        return bound, min(bound, expected_blocks(num_pairs, num_experts, num_global_experts, gemm.block_m))

    blocks1, blocks2 = blocks(cfg.gemm1), blocks(cfg.gemm2)
    tiles1 = cdiv(inter, cfg.gemm1.block_n)
    within = WHOLE_GRID_WITHIN if num_pairs <= WHOLE_GRID_PAIRS_PER_EXPERT * num_global_experts else 0.0
    launch1 = plan_launch(hidden, cfg.gemm1, tiles1, *blocks1, sms, whole_grid_within=within,
                          like=like and like.gemm1)  # fmt: skip
    steps = cdiv(hidden, cfg.gemm1.block_k)
    stream = cfg.gemm1.stream * sms
    if (
        stream
        and like is None
        and num_pairs <= STREAM_PAIRS_PER_EXPERT * num_global_experts
        and stream_fits(stream, blocks1[0] * tiles1 * steps)
    ):
        launch1 = Launch(blocks1[0], 1, steps * cfg.gemm1.block_k, stream=stream)  # else the planned grid
    tiles2 = cdiv(hidden, cfg.gemm2.block_n)
    if like is not None:  # its tiles a program, and so whether gemm2 may split at all
        per_program = like.per_program
    else:
        per_program = gemm2_tiles_per_program(inter, cfg.gemm2)
        least = 2 if cfg.gemm2.one_k_step else 1  # a one-step tile runs only with several N tiles a program
        while per_program > least and blocks2[1] * cdiv(tiles2, per_program) < MULTI_TILE_PROGRAMS_PER_SM * sms:
            per_program //= 2  # few blocks: keep the programs that fill the GPU
    launch2 = plan_launch(inter, cfg.gemm2, cdiv(tiles2, per_program), *blocks2, sms, split=per_program == 1,
                          whole_grid_within=within, like=like and like.gemm2)  # fmt: skip
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


def expert_groups(
    num_pairs: int, num_experts: int, num_global_experts: int, one_launch_routing: bool, gemm2_tiles_a_program: int
) -> int:
    """1, or ``CHAINS`` where the op runs as that many chains, each over a CHAINS-th of the local experts (an equal
    group, or every CHAINS-th active expert: ``interleaves``), by ``TWO_CHAINS_TOKENS_PER_EXPERT`` and
    ``SGLANG_GLM5_TWO_CHAINS``: an expert count that CHAINS divides, a routing of one launch (below
    ``routing.CHUNKED_ROUTE_PAIRS`` pairs) and gemm2 one N tile a program (``gemm2_tiles_per_program``; any, with
    ``CHAINS_MULTI_TILE_GEMM2``). Off a GPU (the interpreter) the op runs the chains one after the other."""
    span = TWO_CHAINS_TOKENS_PER_EXPERT
    if span is None or CHAINS < 2 or num_experts % CHAINS or not one_launch_routing:
        return 1
    if gemm2_tiles_a_program != 1 and not CHAINS_MULTI_TILE_GEMM2:
        return 1
    if not env.get(env.TWO_CHAINS):
        return 1
    return CHAINS if span[0] <= num_pairs / num_global_experts <= span[1] else 1


def interleaves(num_pairs: int, num_global_experts: int) -> bool:
    """Whether the chains of a call with ``num_pairs`` (token, slot) pairs each take every CHAINS-th active expert
    rather than a contiguous group (``INTERLEAVED_TOKENS_PER_EXPERT``)."""
    return num_pairs <= INTERLEAVED_TOKENS_PER_EXPERT * num_global_experts


def chain_sms(sms: int, chains: int) -> int:
    """The SMs a chain's grids are sized for: all of them, or with ``CHAIN_SM_SHARE`` its share."""
    return max(1, sms // chains) if CHAIN_SM_SHARE else sms


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
    steps = cdiv(k_size, block_k)
    per_split = cdiv(steps, max(1, min(steps, want, MAX_SPLITS)))
    return cdiv(steps, per_split), per_split * block_k


def gemm2_tiles_per_program(inter: int, cfg: GemmConfig) -> int:
    """N tiles per gemm2 program: as many as fit in 8 K steps (one when a tile alone takes 5 or more).

    Measured on the H200 (bench/h200/runs/exp_flat_loop*.json): with I = 256 (GLM-5 TP8: one or two
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
    """Whether gemm2 computes each N tile as two halves (``GEMM2_HALVES``): one tile per program, a tile that can."""
    return GEMM2_HALVES and per_program == 1 and halvable(cfg)


@dataclass(frozen=True)
class CallPlan:
    """What one call of the W4A16 op launches (``w4a16.run``), decided on the host from its sizes, tiles, device and
    switches alone, never from tensor values: every call of the same shape gets the same plan (``call_plan``)."""

    chains: int  # 1, or CHAINS (``expert_groups``), each over chain_experts of the local experts
    chain_experts: int
    interleaved: bool  # each chain takes every CHAINS-th active expert (``interleaves``), else a contiguous group
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
    device: torch.device, dtype: torch.dtype, layout: str, sms: int,
) -> CallPlan:  # fmt: skip
    """The plan of one call on ``device`` (``sms`` SMs): the rules above, applied in the order the op launches by
    (chains, grids, PDL, the wait for gemm1, the routing's form). With chains, each chain's grids are sized for its
    share of the experts and SMs but keep one chain's K splits, and the plan carries one chain's (``alone``): the
    chains change where the programs run, never the bits. A stream-K gemm1, whose segments follow its program count
    and the blocks in use, keeps one chain."""
    chains = expert_groups(num_pairs, num_experts, num_global_experts, num_pairs < routing.CHUNKED_ROUTE_PAIRS,
                           gemm2_tiles_per_program(inter, cfg.gemm2))  # fmt: skip
    whole = plan_gemms(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, sms)
    rules = (cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout)
    alone = _launch_rules(*rules, 1, whole)
    if chains == 1 or whole.gemm1.stream:
        return alone
    share = plan_gemms(cfg, num_pairs, num_experts // chains, num_global_experts, hidden, inter,
                       chain_sms(sms, chains), like=whole)  # fmt: skip
    return dataclasses.replace(_launch_rules(*rules, chains, share), alone=alone)


def _launch_rules(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str, chains: int, plan: GemmPlan,
) -> CallPlan:  # fmt: skip
    """``plan_call``'s answer for ``chains`` chains on grids ``plan``: PDL, the wait for gemm1, the routing's form."""
    interpret = interpreting()
    chain_experts = num_experts // chains
    interleaved = chains > 1 and interleaves(num_pairs, num_global_experts)
    may_pdl = uses_pdl(device)
    gluon = (w4a16_gluon.applies(device, layout, hidden, cfg.gemm1, dtype),
             w4a16_gluon.applies(device, layout, inter, cfg.gemm2, dtype))  # fmt: skip
    tail = not gluon[1] and overlaps_tail(cfg, plan, num_pairs, num_global_experts, may_pdl or interpret)
    if tail:  # a block's N tiles side by side in both GEMMs
        plan = in_tail_order(plan)
    below = num_pairs < PDL_BELOW_TOKENS_PER_EXPERT * num_global_experts
    pdl = frozenset(PDL_LAUNCHES) if may_pdl and (below or tail) else frozenset()
    awaits = tail or (
        not gluon[1] and awaits_blocks(cfg, plan, num_pairs, num_global_experts, "gemm2" in pdl or interpret)
    )
    return CallPlan(
        chains=chains,
        chain_experts=chain_experts,
        interleaved=interleaved,
        gemms=plan,
        pdl=pdl,
        ready=num_blocks_bound(num_pairs, chain_experts, cfg.gemm1.block_m) if awaits else 0,
        ready_tiles=cdiv(inter, cfg.gemm1.block_n),
        each_pair=num_pairs <= min(EACH_PAIR_MAX_PAIRS, chain_experts) and not interleaved,
        gluon=gluon,
    )


# The switches a plan reads (their raw text is part of its memo key) and the modules whose settings and functions it
# reads (their values are part of it too: tests and experiments change a setting, or replace a rule, between calls).
PLAN_SWITCHES = (env.PDL.name, env.TWO_CHAINS.name, env.GLUON_GEMM1.name)
PLAN_MODULES = (__name__, routing.__name__, w4a16_gluon.__name__)
# Plans remembered per process (a server calls with a few shapes per layer shape; beyond this many, each new shape
# is planned on every call, as before the memo).
MEMO_PLANS = 4096
_PLANS: dict[tuple, CallPlan] = {}


def _key_names() -> tuple[tuple[dict, str], ...]:
    """(module namespace, name) of every setting and function of PLAN_MODULES that ``plan_call`` reads, itself or
    through the functions it calls there: found in their code once, when this module loads (``_KEY_NAMES``); a name
    read as ``module.NAME`` counts as that module's. The tuner's dicts of tiles, which no plan reads, stay out."""
    spaces = [vars(sys.modules[m]) for m in PLAN_MODULES]
    found: dict[tuple[int, str], tuple[dict, str]] = {}
    todo, done = [plan_call], set()
    while todo:
        fn = inspect.unwrap(todo.pop())
        if id(fn) in done or not hasattr(fn, "__code__"):
            continue
        done.add(id(fn))
        codes, names = [fn.__code__], set()
        while codes:
            code = codes.pop()
            names |= set(code.co_names)
            codes += [c for c in code.co_consts if inspect.iscode(c)]
        for name in names:
            for space in (vars(sys.modules[fn.__module__]), *spaces):
                if space["__name__"] not in PLAN_MODULES or name not in space:
                    continue
                value = space[name]
                if name.isupper() and not isinstance(value, (dict, list, set)):
                    found[id(space), name] = (space, name)
                elif inspect.isroutine(value):
                    found[id(space), name] = (space, name)
                    if getattr(inspect.unwrap(value), "__module__", None) in PLAN_MODULES:
                        todo.append(value)
    return tuple(found.values())


def plan_settings() -> tuple:
    """What a plan reads beyond its arguments, as it is now: PLAN_SWITCHES' text, and the settings and functions of
    PLAN_MODULES that ``plan_call`` reads (``_key_names``, found when this module loads, before a test or an experiment
    can replace a function)."""
    return tuple(os.environ.get(name) for name in PLAN_SWITCHES) + tuple(space[n] for space, n in _KEY_NAMES)


def call_plan(
    cfg: MoeConfig, num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int,
    device: torch.device, dtype: torch.dtype, layout: str,
) -> CallPlan:  # fmt: skip
    """``plan_call`` for a call on ``device``, remembered per distinct call: the key holds what the rules read (the
    arguments, the interpreter switch, the device's index and SM count, ``plan_settings``); a device's architecture is
    its index's. Working the rules out took tens of microseconds of each eager call's host time (bench/README.md, run
    52)."""
    interpret = interpreting()
    index = None
    if device.type == "cuda" and not interpret:
        index = device.index if device.index is not None else torch.cuda.current_device()
    sms = sm_count(index)
    key = (cfg, num_pairs, num_experts, num_global_experts, hidden, inter, interpret, index, sms, dtype, layout,
           plan_settings())  # fmt: skip
    try:
        plan = _PLANS.get(key)
    except TypeError:  # a setting changed to a value that keys no dict (a list, say): planned, not remembered
        return plan_call(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout, sms)
    if plan is None:
        plan = plan_call(cfg, num_pairs, num_experts, num_global_experts, hidden, inter, device, dtype, layout, sms)
        if len(_PLANS) < MEMO_PLANS:
            _PLANS[key] = plan
    return plan


_KEY_NAMES = _key_names()
