"""The W4A16 op's small launches: the routing sort (pairs by expert into blocks of BLOCK_M, in one launch or, for
many pairs, two), the activations laid out in the GEMMs' K order (alone, or in the routing's launch), and the
top-k sum. ``sglang_glm5.routing`` launches them; the K order is ``nvfp4_moe``'s (its module docstring).
"""

import triton
import triton.language as tl

from sglang_glm5.kernels.moe_common import after_previous_launch, let_next_launch, round_to


@triton.jit
def permute_activation_tile(
    x_ptr,  # [T, K] bf16/fp16
    xp_ptr,  # [T, K] out, dtype of x: each 32 columns as [0, 4, .., 28, 1, 5, .., 29, 2, .., 3, .., 31] (or WGMMA)
    num_rows,
    K,
    stride_xt,
    stride_pt,
    tile,  # which [BLOCK_T, BLOCK_K] tile, row-major over the tiles of x
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WGMMA: tl.constexpr = False,  # the K order of weights in the "kernel_wgmma" layout (period 64, K % 64 == 0)
):
    k_tiles = tl.cdiv(K, BLOCK_K)
    rows = (tile // k_tiles) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (tile % k_tiles) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < num_rows)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xt + cols[None, :], mask=mask, other=0.0)
    if WGMMA:  # column 64g + 16b + 8h + 4i + q at 64g + 16q + 8h + 2b + i (_permuted_column)
        x = tl.permute(tl.reshape(x, (BLOCK_T, BLOCK_K // 64, 4, 2, 2, 4)), (0, 1, 5, 3, 2, 4))
        x = tl.reshape(x, (BLOCK_T, BLOCK_K))
    else:  # column 32g + 4c + q at 32g + 8q + c
        x = tl.reshape(tl.permute(tl.reshape(x, (BLOCK_T, BLOCK_K // 32, 8, 4)), (0, 1, 3, 2)), (BLOCK_T, BLOCK_K))
    tl.store(xp_ptr + rows.to(tl.int64)[:, None] * stride_pt + cols[None, :], x, mask=mask)


@triton.jit
def prepare_activations_kernel(
    x_ptr,  # [T, K] bf16/fp16
    xp_ptr,  # [T, K] out, the permuted K order (permute_activation_tile)
    num_rows,
    K,
    stride_xt,
    stride_pt,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WGMMA: tl.constexpr = False,  # the "kernel_wgmma" K order (permute_activation_tile)
):
    permute_activation_tile(x_ptr, xp_ptr, num_rows, K, stride_xt, stride_pt, tl.program_id(0), BLOCK_T, BLOCK_K,
                            WGMMA)  # fmt: skip


@triton.jit
def moe_sum_kernel(
    y_ptr,  # [splits, rows, H] per-pair outputs (rows of invalid slots are never read)
    topk_ids_ptr,  # [T * k] int32/int64, valid when 0 <= id < num_experts
    row_map_ptr,  # [T * k] int32 row of y holding pair p (HAS_ROW_MAP), else y's row p is pair p
    out_ptr,  # [T, H]
    hidden_size,
    num_experts,
    stride_ys,  # between the splits of y (SPLITS > 1)
    stride_yt,
    stride_ot,
    TOP_K: tl.constexpr,
    SPLITS: tl.constexpr,  # K splits of gemm2 to add (1: y holds finished rows)
    BLOCK_H: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    INTERPRETER: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (after_previous_launch, let_next_launch)
):
    """out[t] = sum of y over the valid slots of token t (and over the splits), in fp32, slots and then
    splits in order (deterministic)."""
    after_previous_launch(PDL)
    let_next_launch(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs < hidden_size
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        eid = tl.load(topk_ids_ptr + t * TOP_K + j)
        valid = (eid >= 0) & (eid < num_experts)
        row = t * TOP_K + j
        if HAS_ROW_MAP:
            row = tl.load(row_map_ptr + row, mask=valid, other=0).to(tl.int64)
        for split in tl.static_range(SPLITS):
            y = tl.load(y_ptr + split * stride_ys + row * stride_yt + offs, mask=h_ok & valid, other=0.0)
            acc += y.to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs, round_to(acc, out_ptr.dtype.element_ty, INTERPRETER), mask=h_ok)


@triton.jit
def moe_align_kernel(
    topk_ids_ptr,  # [P] int32/int64, flattened [T, k]
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 out: pair ids by expert, P = padding
    block_expert_ptr,  # [num_blocks] int32 out: expert of each block, -1 = unused
    used_blocks_ptr,  # [1] int32 out: blocks 0 .. used - 1 hold pairs
    zero_ptr,  # [num_zero] int32 out: set to 0 (the split-K counters of the GEMMs that follow)
    x_ptr,  # [T, H] activations to lay out for the GEMMs (PERMUTE), else unused
    xp_ptr,  # [T, H] out: x in the permuted K order (PERMUTE)
    num_pairs,
    num_experts,
    first_expert,  # an id i is taken as expert i - first_expert (a group of experts routed on its own), else dropped
    chain,  # with chains > 1: route only the experts whose rank among the active ones is chain modulo chains
    chains,
    num_blocks,
    num_zero,
    num_rows,  # T (PERMUTE)
    x_cols,  # H (PERMUTE)
    stride_xt,
    stride_pt,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,  # power of two >= num_experts
    BLOCK: tl.constexpr,
    PERMUTE: tl.constexpr,  # programs past E also write x in the GEMMs' K order (prepare_activations_kernel)
    PERMUTE_T: tl.constexpr,
    PERMUTE_K: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (after_previous_launch, let_next_launch)
    WGMMA: tl.constexpr = False,  # xp in the "kernel_wgmma" K order (permute_activation_tile)
    EACH_PAIR: tl.constexpr = False,  # a block per valid pair, in pair order, by one program (_route_each_pair)
):
    """One launch, E + 1 programs (and with PERMUTE one per activation tile after them). Each of the
    first E + 1 counts the pairs of every expert (a histogram of the ids); program e < E then writes
    expert e's pairs (in pair order), its padding and its block experts; program E marks the unused tail
    blocks and writes the number of used blocks. They share zeroing ``zero_ptr``. With EACH_PAIR, one
    program routes (``_route_each_pair``: no sort) and the activation tiles' programs follow it."""
    after_previous_launch(PDL)
    let_next_launch(PDL)
    e = tl.program_id(0)
    if EACH_PAIR:
        if PERMUTE and e > 0:
            permute_activation_tile(x_ptr, xp_ptr, num_rows, x_cols, stride_xt, stride_pt, e - 1, PERMUTE_T,
                                    PERMUTE_K, WGMMA)  # fmt: skip
        else:
            _route_each_pair(topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, zero_ptr, num_pairs,
                             num_experts, first_expert, num_blocks, num_zero, BLOCK_M, E_PAD, BLOCK)  # fmt: skip
    elif PERMUTE and e > num_experts:
        tile = e - num_experts - 1
        permute_activation_tile(x_ptr, xp_ptr, num_rows, x_cols, stride_xt, stride_pt, tile, PERMUTE_T, PERMUTE_K,
                                WGMMA)  # fmt: skip
    else:
        _route_program(topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, zero_ptr, num_pairs,
                       num_experts, first_expert, chain, chains, num_blocks, num_zero, e, BLOCK_M, E_PAD,
                       BLOCK)  # fmt: skip


@triton.jit
def _route_each_pair(
    topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, zero_ptr, num_pairs, num_experts, first_expert,
    num_blocks, num_zero, BLOCK_M: tl.constexpr, BLOCKS_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``moe_align_kernel`` for a few pairs (num_blocks <= BLOCKS_PAD, a power of two): block r holds the r-th valid
    pair alone (pair order), blocks past the valid pairs get expert -1. Two pairs of one expert take two blocks, so
    no sort and no histogram: one program."""
    _zero_share(zero_ptr, num_zero, 0, 1, BLOCK)
    b = tl.arange(0, BLOCKS_PAD)
    ids = tl.load(topk_ids_ptr + b, mask=b < num_pairs, other=-1) - first_expert
    ok = (ids >= 0) & (ids < num_experts)
    rank = tl.cumsum(ok.to(tl.int32), axis=0) - 1  # the block of pair b, if valid
    used = tl.sum(ok.to(tl.int32), axis=0)
    tl.store(block_expert_ptr + b, -1, mask=(b >= used) & (b < num_blocks))
    tl.store(block_expert_ptr + rank, ids.to(tl.int32), mask=ok)
    slot = tl.arange(0, BLOCK_M)
    padding = (b < num_blocks)[:, None] & ((b >= used)[:, None] | (slot > 0)[None, :])
    tl.store(sorted_ids_ptr + b[:, None] * BLOCK_M + slot[None, :], num_pairs, mask=padding)
    tl.store(sorted_ids_ptr + rank * BLOCK_M, b, mask=ok)
    tl.store(used_blocks_ptr, used)


@triton.jit
def _route_program(
    topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, zero_ptr, num_pairs, num_experts, first_expert,
    chain, chains, num_blocks, num_zero, e, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program e (0 .. E) of ``moe_align_kernel``'s routing. Of the experts that hold pairs, those whose rank among
    them is ``chain`` modulo ``chains`` (all of them with one chain): the others count as holding none."""
    _zero_share(zero_ptr, num_zero, e, num_experts + 1, BLOCK)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1) - first_expert
        ok = (ids >= 0) & (ids < num_experts)
        counts += tl.histogram(tl.where(ok, ids, 0).to(tl.int32), E_PAD, mask=ok)
    if chains > 1:  # a chain of several (chains == 1 is specialized by Triton: this drops out of the one-chain kernel)
        active = (counts > 0).to(tl.int32)
        counts = tl.where((tl.cumsum(active, axis=0) - 1) % chains == chain, counts, 0)
    offs_e = tl.arange(0, E_PAD)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    first_block = tl.sum(tl.where(offs_e < e, blocks, 0), axis=0)
    if e < num_experts:
        count = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
        my_blocks = tl.sum(tl.where(offs_e == e, blocks, 0), axis=0)
        base = first_block * BLOCK_M
        placed = 0
        for start in range(0, num_pairs, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1) - first_expert
            hit = ((ids == e) & (count > 0)).to(tl.int32)  # an expert of another chain places nothing
            rank = placed + tl.cumsum(hit, axis=0) - 1
            tl.store(sorted_ids_ptr + base + rank, offs.to(tl.int32), mask=hit != 0)
            placed += tl.sum(hit, axis=0)
        _expert_blocks(sorted_ids_ptr, block_expert_ptr, e, count, first_block, my_blocks, num_pairs, BLOCK_M, BLOCK)
    else:
        _unused_blocks(sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, first_block, num_blocks, num_pairs, BLOCK_M,
                       BLOCK)  # fmt: skip


@triton.jit
def _zero_share(zero_ptr, num_zero, program, programs, BLOCK: tl.constexpr):
    """Program ``program`` of ``programs`` zeroes its share of ``zero_ptr`` (the split-K counters): BLOCK entries in
    every ``programs`` * BLOCK from program * BLOCK."""
    for start in range(program * BLOCK, num_zero, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(zero_ptr + offs, 0, mask=offs < num_zero)


@triton.jit
def _expert_blocks(sorted_ids_ptr, block_expert_ptr, e, count, first, blocks, num_pairs, BLOCK_M: tl.constexpr,
                   BLOCK: tl.constexpr):  # fmt: skip
    """Expert e's routing blocks first .. first + blocks - 1 (its count pairs already placed): P in the padding slots
    after its pairs, e as the blocks' expert."""
    for start in range(count, blocks * BLOCK_M, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(sorted_ids_ptr + first * BLOCK_M + offs, num_pairs, mask=offs < blocks * BLOCK_M)
    for start in range(0, blocks, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(block_expert_ptr + first + offs, e, mask=offs < blocks)


@triton.jit
def _unused_blocks(sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, used, num_blocks, num_pairs,
                   BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The blocks past the used ones: expert -1, every slot P; and the used block count."""
    tl.store(used_blocks_ptr, used)
    for start in range(used, num_blocks, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(block_expert_ptr + offs, -1, mask=offs < num_blocks)
    for start in range(used * BLOCK_M, num_blocks * BLOCK_M, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(sorted_ids_ptr + offs, num_pairs, mask=offs < num_blocks * BLOCK_M)


@triton.jit
def route_count_kernel(
    topk_ids_ptr,  # [P] int32/int64, flattened [T, k]
    counts_ptr,  # [chunks, E_PAD] int32 out: each chunk's pairs per expert
    zero_ptr,  # [num_zero] int32 out: set to 0 (the split-K counters of the GEMMs that follow)
    x_ptr,  # [T, H] activations to lay out for the GEMMs (PERMUTE), else unused
    xp_ptr,  # [T, H] out: x in the permuted K order (PERMUTE)
    num_pairs,
    num_experts,
    num_zero,
    num_rows,  # T (PERMUTE)
    x_cols,  # H (PERMUTE)
    stride_xt,
    stride_pt,
    E_PAD: tl.constexpr,  # power of two >= num_experts
    CHUNK: tl.constexpr,  # pairs a chunk
    PERMUTE: tl.constexpr,  # programs past the chunks write x in the GEMMs' K order (prepare_activations_kernel)
    PERMUTE_T: tl.constexpr,
    PERMUTE_K: tl.constexpr,
    WGMMA: tl.constexpr = False,  # xp in the "kernel_wgmma" K order (permute_activation_tile)
):
    """The first of the two launches of the chunked routing (``route_place_kernel`` is the second): program c of the
    first cdiv(P, CHUNK) counts chunk c's pairs per expert (ids outside [0, E) are not counted) and zeroes its share
    of ``zero_ptr``; with PERMUTE one program per activation tile follows them."""
    c = tl.program_id(0)
    chunks = tl.cdiv(num_pairs, CHUNK)
    if c < chunks:
        _zero_share(zero_ptr, num_zero, c, chunks, CHUNK)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
        ok = (ids >= 0) & (ids < num_experts)
        counts = tl.histogram(tl.where(ok, ids, 0).to(tl.int32), E_PAD, mask=ok)
        tl.store(counts_ptr + c * E_PAD + tl.arange(0, E_PAD), counts)
    elif PERMUTE:
        permute_activation_tile(x_ptr, xp_ptr, num_rows, x_cols, stride_xt, stride_pt, c - chunks, PERMUTE_T,
                                PERMUTE_K, WGMMA)  # fmt: skip


@triton.jit
def route_place_kernel(
    topk_ids_ptr,  # [P] int32/int64, flattened [T, k]
    counts_ptr,  # [chunks, E_PAD] int32: route_count_kernel's
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 out: pair ids by expert, P = padding
    block_expert_ptr,  # [num_blocks] int32 out: expert of each block, -1 = unused
    used_blocks_ptr,  # [1] int32 out: blocks 0 .. used - 1 hold pairs
    num_pairs,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,  # power of two >= num_experts
    CHUNK: tl.constexpr,  # pairs a chunk (route_count_kernel's)
    ROWS: tl.constexpr,  # rows of the counts table read at a time
):
    """The second launch of the chunked routing: the same outputs as ``moe_align_kernel``'s sort. Every program adds
    the counts table up (each expert's pairs, blocks and first block). Program c of the first cdiv(P, CHUNK) places
    chunk c's pairs: sorted by (expert, pair), the j-th of them goes to its expert's first slot, plus the pairs of
    that expert in the chunks before, plus its rank among the chunk's pairs of that expert; so pair ids come in
    increasing order within an expert, as in the one-launch sort. Program chunks + e (e < E) writes expert e's padding
    and block experts, and the last one the unused tail and the used block count."""
    c = tl.program_id(0)
    chunks = tl.cdiv(num_pairs, CHUNK)
    offs_e = tl.arange(0, E_PAD)
    totals = tl.zeros((E_PAD,), dtype=tl.int32)
    before = tl.zeros((E_PAD,), dtype=tl.int32)  # pairs of each expert in the chunks before chunk c
    for r0 in range(0, chunks, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        table = tl.load(counts_ptr + rows[:, None] * E_PAD + offs_e[None, :], mask=(rows < chunks)[:, None], other=0)
        totals += tl.sum(table, axis=0)
        before += tl.sum(tl.where((rows < c)[:, None], table, 0), axis=0)
    blocks = (totals + BLOCK_M - 1) // BLOCK_M
    first_block = tl.cumsum(blocks, axis=0) - blocks
    if c < chunks:
        local = tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + c * CHUNK + local, mask=c * CHUNK + local < num_pairs, other=-1)
        ok = (ids >= 0) & (ids < num_experts)
        # one key a pair: (expert, pair in the chunk); the pairs of no local expert sort last (expert E_PAD)
        keys = tl.sort(tl.where(ok, ids, E_PAD).to(tl.int32) * CHUNK + local)
        expert = keys // CHUNK
        valid = expert < E_PAD
        mine = tl.load(counts_ptr + c * E_PAD + offs_e)
        # slot of the chunk's first pair of expert e, less the sorted position of that pair
        first = first_block * BLOCK_M + before - (tl.cumsum(mine, axis=0) - mine)
        slot = tl.gather(first, tl.where(valid, expert, 0), 0) + local
        tl.store(sorted_ids_ptr + slot, c * CHUNK + keys % CHUNK, mask=valid)
    elif c < chunks + num_experts:
        e = c - chunks
        count = tl.sum(tl.where(offs_e == e, totals, 0), axis=0)
        my_blocks = tl.sum(tl.where(offs_e == e, blocks, 0), axis=0)
        base = tl.sum(tl.where(offs_e == e, first_block, 0), axis=0)
        _expert_blocks(sorted_ids_ptr, block_expert_ptr, e, count, base, my_blocks, num_pairs, BLOCK_M, CHUNK)
    else:
        _unused_blocks(sorted_ids_ptr, block_expert_ptr, used_blocks_ptr, tl.sum(blocks, axis=0), num_blocks,
                       num_pairs, BLOCK_M, CHUNK)  # fmt: skip
