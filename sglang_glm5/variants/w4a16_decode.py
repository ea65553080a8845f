"""The W4A16 op in one launch for decode steps of a few pairs (``kernels/nvfp4_moe_decode.py``).

``w4a16.run`` takes this path where ``applies``: at most ``MAX_PAIRS`` (token, slot) pairs, no config given by the
caller (the tuner and the benches that name tiles time the four-launch op they name). The grid is a fixed number of
persistent programs (``plan``: all resident at once, as the kernel's waits need), the K splits of both GEMMs are
planned from sizes the host knows (the pairs expected local under uniform routing), so there is no host sync and a
CUDA graph captured with one routing replays right with another.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from sglang_glm5.kernels import nvfp4_moe_decode as _kd
from sglang_glm5.nvfp4 import LAYOUTS
from sglang_glm5.routing import interpreting, uses_pdl

# At most this many pairs (GLM-5, top-8: B <= 4 tokens a step); 0 turns the path off.
MAX_PAIRS = 0
# Tiles (N rows, K step) of gemm1 (gate and up rows each) and gemm2, warps and stages of the one kernel.
TILE1 = (128, 256)
TILE2 = (64, 256)
NUM_WARPS = 4
NUM_STAGES = 2
PROGRAMS_PER_SM = 2
POLL = 0  # kernels/nvfp4_moe_decode.py, _await_count
SLEEP_NS = 0
TWO_LAUNCHES = False  # gemm1's units in one launch, gemm2's in the next (as the interpreter runs it)
USE_PDL = True
PHASES = 3  # an experiment's switch: 1 runs gemm1's units alone (the output is then not the op's)
BLOCK_M = 16  # a pair is row 0 of a block: the narrowest tile the tensor cores take


class Plan(NamedTuple):
    programs: int
    splits1: int
    k1_per_split: int
    splits2: int
    k2_per_split: int


def applies(num_pairs: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype) -> bool:
    """Whether the op runs in one launch: few pairs, 16-bit activations, K of both GEMMs whole K steps."""
    return (
        0 < num_pairs <= MAX_PAIRS
        and dtype in (torch.bfloat16, torch.float16)
        and hidden % TILE1[1] == 0
        and inter % min(TILE2[1], inter) == 0
        and inter % 64 == 0
        and top_k > 0
    )


def _splits(k_size: int, block_k: int, want: int) -> tuple[int, int]:
    """(splits, K elements per split): at most ``want`` splits of whole K steps, none empty."""
    steps = triton.cdiv(k_size, block_k)
    per_split = triton.cdiv(steps, max(1, min(steps, want)))
    return triton.cdiv(steps, per_split), per_split * block_k


def plan(num_pairs: int, num_experts: int, num_global_experts: int, hidden: int, inter: int, programs: int) -> Plan:
    """Splits so that the expected units of each GEMM (local pairs expected x N tiles x splits) fill ``programs``."""
    pairs = max(1, round(num_pairs * num_experts / num_global_experts))
    block_k2 = min(TILE2[1], inter)
    splits1, k1 = _splits(hidden, TILE1[1], programs // (pairs * triton.cdiv(inter, TILE1[0])))
    splits2, k2 = _splits(inter, block_k2, programs // (pairs * triton.cdiv(hidden, TILE2[0])))
    return Plan(programs, splits1, k1, splits2, k2)


@functools.cache
def _resident_programs(device_index: int, regs: int, shared: int, threads: int) -> int:
    """Programs of a kernel that fit on the device at once (registers, shared memory, threads)."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm = min(
        props.regs_per_multiprocessor // max(1, regs * threads),
        props.max_threads_per_multi_processor // threads,
        props.shared_memory_per_multiprocessor // max(1, shared) if shared else 32,
        32,
    )
    return per_sm * props.multi_processor_count


_workspaces: dict[tuple, torch.Tensor] = {}


def _counters(numel: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters the kernel leaves zeroed: kept per device and stream where allocated outside a CUDA graph
    capture; inside one, allocated by the call (the graph zeroes them at every replay)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        key = None
    else:
        key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    cached = _workspaces.get(key) if key else None
    if cached is not None and cached.numel() >= numel:
        return cached[:numel]
    counters = torch.zeros(numel, dtype=torch.int32, device=device)
    if key:
        _workspaces[key] = counters
    return counters


def run(hidden_states, weights, topk_weights, topk_ids, *, out, num_global_experts: int, sms: int):
    """The op in one launch (``applies``) into ``out``."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = weights.shape
    num_pairs = num_tokens * top_k
    device = hidden_states.device
    interpret = interpreting()
    block_n1, block_k1 = TILE1
    block_n2, block_k2 = TILE2[0], min(TILE2[1], inter)
    tiles1, tiles2 = triton.cdiv(inter, block_n1), triton.cdiv(hidden, block_n2)
    p = plan(num_pairs, num_experts, num_global_experts, hidden, inter, sms * PROGRAMS_PER_SM)
    part = torch.empty((p.splits1, num_pairs, 2, inter) if p.splits1 > 1 else (1,), dtype=torch.float32,
                       device=device)  # fmt: skip
    h = torch.empty((num_pairs, inter), dtype=hidden_states.dtype, device=device)
    y = torch.empty((p.splits2, num_pairs, hidden), dtype=torch.float32, device=device)
    n_split, n_ready, n_token = num_pairs * tiles1, num_pairs, num_tokens * tiles2
    counters = _counters(n_split + n_ready + n_token + num_tokens, device)
    gs13 = weights.w13_scale_2
    w13, w2 = weights.w13.view(torch.int16), weights.w2.view(torch.int16)  # 4 nibbles an element
    gate_row0, up_row0 = weights.gate_up_rows
    pdl = USE_PDL and uses_pdl(device)
    args = dict(
        x_ptr=hidden_states,
        w13_ptr=w13,
        s13_ptr=weights.w13_scale.view(torch.uint8),
        gs13_ptr=gs13,
        w2_ptr=w2,
        s2_ptr=weights.w2_scale.view(torch.uint8),
        gs2_ptr=weights.w2_scale_2,
        topk_ids_ptr=topk_ids.reshape(-1).contiguous(),
        topk_weights_ptr=topk_weights.reshape(-1).contiguous(),
        part_ptr=part,
        h_ptr=h,
        y_ptr=y,
        out_ptr=out,
        split_count_ptr=counters[:n_split],
        ready_ptr=counters[n_split : n_split + n_ready],
        token_count_ptr=counters[n_split + n_ready : n_split + n_ready + n_token],
        tiles_done_ptr=counters[n_split + n_ready + n_token :],
        num_pairs=num_pairs,
        num_experts=num_experts,
        inter_size=inter,
        hidden_size=hidden,
        k1_per_split=p.k1_per_split,
        k2_per_split=p.k2_per_split,
        stride_xt=hidden_states.stride(0),
        stride_w13e=w13.stride(0),
        stride_w13n=w13.stride(1),
        stride_s13e=weights.w13_scale.stride(0),
        stride_s13n=weights.w13_scale.stride(1),
        stride_gse=gs13.stride(0),
        stride_gsg=gs13.stride(1) if gs13.dim() == 2 else 0,
        stride_w2e=w2.stride(0),
        stride_w2n=w2.stride(1),
        stride_s2e=weights.w2_scale.stride(0),
        stride_s2n=weights.w2_scale.stride(1),
        stride_ot=out.stride(0),
        gate_row0=gate_row0,
        up_row0=up_row0,
        TOP_K=top_k,
        PAIRS_PAD=triton.next_power_of_2(num_pairs),
        BLOCK_M=BLOCK_M,
        BLOCK_N1=block_n1,
        BLOCK_K1=block_k1,
        BLOCK_N2=block_n2,
        BLOCK_K2=block_k2,
        SPLITS1=p.splits1,
        SPLITS2=p.splits2,
        EVEN_K1=hidden % block_k1 == 0,
        EVEN_K2=inter % block_k2 == 0,
        LAYOUT=LAYOUTS.index(weights.layout),
        INTERPRETER=interpret,
        PDL=pdl,
        POLL=POLL,
        SLEEP_NS=SLEEP_NS,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if interpret or TWO_LAUNCHES:  # programs run one after another there: gemm1's units first, then gemm2's
        _kd.nvfp4_moe_decode_kernel[(p.programs,)](**args, PHASES=1, launch_pdl=pdl)
        _kd.nvfp4_moe_decode_kernel[(p.programs,)](**args, PHASES=2, launch_pdl=pdl)
        return out
    kernel = _kd.nvfp4_moe_decode_kernel.warmup(**args, PHASES=PHASES, grid=(p.programs,))
    kernel._init_handles()  # loads it: its register count is known from here
    resident = _resident_programs(device.index, kernel.n_regs, kernel.metadata.shared, NUM_WARPS * 32)
    if p.programs > resident:
        raise RuntimeError(f"one-launch decode: {p.programs} programs, {resident} fit on the GPU at once")
    _kd.nvfp4_moe_decode_kernel[(p.programs,)](**args, PHASES=PHASES, launch_pdl=pdl)
    return out
