"""Experiment: how fast the Gluon gemm1's K step runs when nothing has to arrive from memory.

The shipped decode GEMMs move an expert's bytes at 70-82% of the H200's copy bandwidth at busy decode sizes, and at
86% (gemm1) with every byte already in L2 (``decode_ceiling.py``, run 38). Is that the K step's own instruction stream
at the programs per SM the tiles allow, or the copies and the waits for them? This kernel runs the shipped K step
(``nvfp4_moe_gluon``'s ring, decode, quarter wgmmas and waits, in either order of gate and up) over K steps already in
shared memory: each program copies STAGES K steps of one tile once, then walks them ``reps`` times with no copy, with
or without the CTA barrier each real K step starts with; and, to price the copies, with the real ring's copies and
waits at each step as well (refilling the freed slot with another of the program's own 2 * STAGES K steps, which stay
in L2: REGIONS copies of the data, so that the programs do not all read the same lines); with the packed words by TMA;
and with the copies issued by a warp group of their own (warp specialization). Decoded weights a second against the
rate at which the copy bandwidth would deliver them (NVFP4: 0.5625 bytes a weight with its block scale); grids of 1-4
programs per SM, each as many as registers and shared memory keep resident. Nothing here runs in the op.
Usage: python bench/exp/decode_issue.py OUT_DIR   (EXP_STAGES: the ring's depth, default 2)
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from sglang_glm5 import bench_real, nvfp4
from sglang_glm5.kernels import nvfp4_moe_gluon as g
from sglang_glm5.kernels.nvfp4_moe_gluon_ws import consume, ws_barriers

BYTES_PER_WEIGHT = 0.5 + 1 / 16  # an e2m1 code and its share of an e4m3 block scale
BLOCK_M, BLOCK_N, BLOCK_K, WARPS = 16, 64, 256, 4  # the shipped 2-stage Gluon tile (16x64x256-w4-s2-gl)
STAGES = int(os.environ.get("EXP_STAGES", "2"))  # the ring's depth (3: the shipped 3-stage tile's)
# (BARRIER, COPY, TMA): the K step alone with the ring's barrier, without it, with the ring's copies and waits too, and
# with the packed words by TMA instead of cp.async
FORMS = {"barrier": (True, False, False), "bare": (False, False, False), "copies": (True, True, False),
         "tma": (True, True, True)}  # fmt: skip
REGIONS = 128  # copies of the operands (4 K steps each, 13 MB in all: within the H200's 50 MB L2)


@gluon.jit
def _sources(w_ptr, ws_ptr, x_ptr, ids_ptr, regions, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             BLOCK_K: gl.constexpr, WARPS: gl.constexpr, HELD: gl.constexpr):  # fmt: skip
    """This program's region and the pointers its copies read (``nvfp4_moe_gluon.gemm1_sources``, as the shipped
    gemm1 builds them, for a region laid out as one expert of 2 * BLOCK_N rows, gate then up, and BLOCK_M pairs): the
    packed words' and scale codes' rows of gate and up, their columns, the activation rows and their mask."""
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    region = (gl.program_id(0) % regions).to(gl.int64)
    wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = g.gemm1_sources(
        x_ptr + region * (BLOCK_M * HELD * BLOCK_K), w_ptr, ws_ptr, ids_ptr, region, 0, 0, BLOCK_M, 1, BLOCK_N,
        HELD * BLOCK_K, 2 * BLOCK_N * HELD * QK, HELD * QK, 2 * BLOCK_N * HELD * SK, HELD * SK, 0, BLOCK_N, BLOCK_M,
        BLOCK_N, QK, SK, WARPS)  # fmt: skip
    return region, wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok


@gluon.jit
def decode_issue_kernel(
    w_ptr,  # [REGIONS, 2 * BLOCK_N, 2 * STAGES * BLOCK_K / 4] int16 packed codes (kernel_wgmma layout): gate, up rows
    ws_ptr,  # [REGIONS, 2 * BLOCK_N, 2 * STAGES * BLOCK_K / 16] uint8 scale codes
    x_ptr,  # [REGIONS, BLOCK_M, 2 * STAGES * BLOCK_K] bf16 activations
    ids_ptr,  # [BLOCK_M] int32 0 .. BLOCK_M - 1 (the routing block's pairs)
    out_ptr,  # [programs, BLOCK_N, BLOCK_M] fp32: gate + up accumulators (kept live)
    w_desc,  # TMA descriptor of w_ptr as [REGIONS * 2 * BLOCK_N, 2 * STAGES * BLOCK_K / 4], boxes [BLOCK_N, QK]
    reps,  # K steps each program walks
    regions,  # REGIONS: program p reads region p % regions (all programs on one region's lines: an L2 hot spot)
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    LOOKAHEAD: gl.constexpr,
    GATE_THEN_UP: gl.constexpr,
    BARRIER: gl.constexpr,  # a CTA barrier at each K step, as the real ring's
    COPY: gl.constexpr,  # the real ring's copies too: each K step refills the slot freed with another of HELD steps
    TMA: gl.constexpr,  # with COPY: the packed words by TMA (a box a matrix, an mbarrier a slot), the rest by cp.async
):  # fmt: skip
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    HELD: gl.constexpr = 2 * STAGES  # K steps of data a region: the copies refill a slot with another step's
    region, wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = _sources(
        w_ptr, ws_ptr, x_ptr, ids_ptr, regions, BLOCK_M, BLOCK_N, BLOCK_K, WARPS, HELD
    )
    mma: gl.constexpr = g.mma_layout(BLOCK_M, WARPS)
    a_l: gl.constexpr = g.operand_layout(BLOCK_M, WARPS)
    wg_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_desc.layout)
    wu_s = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QK], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(bars.index(b), count=1)
    row_g = (region * (2 * BLOCK_N)).to(gl.int32)
    sg_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    su_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, SK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x0_s, x1_s, x2_s, x3_s = g._activation_rings(STAGES, BLOCK_M, QK)
    for step in gl.static_range(STAGES):
        g.issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, step, step * BLOCK_K, wg_rows, wu_rows,
                             sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, QK, WARPS)  # fmt: skip
    cp.commit_group()
    cp.wait_group(0)
    g.cta_barrier()

    acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for i in range(reps):
        slot = i % STAGES
        if COPY:  # as nvfp4_moe_gemm1_gluon_kernel's loop, the sources a few KB that stay in L2
            cp.wait_group(STAGES - 2)
            if TMA and i >= STAGES - 1:  # step i's words (the first STAGES - 1 came with the fill above)
                mbarrier.wait(bars.index(slot), ((i - STAGES + 1) // STAGES) & 1)
            g.cta_barrier()
            nxt = (i + STAGES - 1) % STAGES
            data = (i + STAGES - 1) % HELD  # the K step of data the slot gets (step i reads step i % HELD's)
            if TMA:
                mbarrier.expect(bars.index(nxt), 2 * BLOCK_N * QK * 2)
                tma.async_copy_global_to_shared(w_desc, [row_g, data * QK], bars.index(nxt), wg_s.index(nxt))
                tma.async_copy_global_to_shared(w_desc, [row_g + BLOCK_N, data * QK], bars.index(nxt),
                                                wu_s.index(nxt))  # fmt: skip
                cp.async_copy_global_to_shared(sg_s.index(nxt), sg_rows[:, None] + (data * SK + s_cols)[None, :])
                cp.async_copy_global_to_shared(su_s.index(nxt), su_rows[:, None] + (data * SK + s_cols)[None, :])
                g._copy_activations(x0_s, x1_s, x2_s, x3_s, nxt, x_rows, x_ok, data * BLOCK_K, QK, WARPS)
            else:
                g.issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, nxt, data * BLOCK_K, wg_rows,
                                     wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, QK, WARPS)  # fmt: skip
            cp.commit_group()
        elif BARRIER:
            g.cta_barrier()
        acc_g, acc_u = g.gemm1_k_step(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, acc_g, acc_u, BLOCK_N, QK,
                                      LOOKAHEAD, GATE_THEN_UP, a_l)  # fmt: skip
    cp.wait_group(0)
    if COPY and TMA:  # the words of the steps issued but not walked
        for j in range(gl.maximum(reps - STAGES + 1, 0), reps):
            mbarrier.wait(bars.index((j + STAGES - 1) % STAGES), (j // STAGES) & 1)
    n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
    tile = gl.program_id(0).to(gl.int64) * BLOCK_N * BLOCK_M
    gl.store(out_ptr + tile + n[:, None] * BLOCK_M + m[None, :], acc_g + acc_u)


# The WS form's sizes as globals: a warp-specialized partition gets its arguments as tensors, so its constexprs come
# from the module.
_BM, _BN, _BK, _WARPS = gl.constexpr(BLOCK_M), gl.constexpr(BLOCK_N), gl.constexpr(BLOCK_K), gl.constexpr(WARPS)
_STAGES = gl.constexpr(STAGES)
_QK, _SK, _HELD = gl.constexpr(BLOCK_K // 4), gl.constexpr(BLOCK_K // 16), gl.constexpr(2 * STAGES)


@gluon.jit
def _ws_consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps, GATE_THEN_UP: gl.constexpr):
    """The WS form's default partition: the K step on each slot once ``full`` says it landed, then ``empty``
    (``nvfp4_moe_gluon_ws.consume``, the real gemm1's consumers); then the accumulators' sum to ``out_ptr``."""
    acc_g, acc_u = consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, reps, GATE_THEN_UP)
    mma: gl.constexpr = g.mma_layout(_BM, _WARPS)
    n = gl.arange(0, _BN, layout=gl.SliceLayout(1, mma))
    m = gl.arange(0, _BM, layout=gl.SliceLayout(0, mma))
    tile = gl.program_id(0).to(gl.int64) * _BN * _BM
    gl.store(out_ptr + tile + n[:, None] * _BM + m[None, :], acc_g + acc_u)


@gluon.jit
def _ws_consumer(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps):
    _ws_consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps, False)


@gluon.jit
def _ws_consumer_gu(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps):
    _ws_consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps, True)


@gluon.jit
def _ws_producer(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, w_ptr, ws_ptr, x_ptr, ids_ptr, reps,
                 regions):  # fmt: skip
    """The WS form's worker partition (a warp group, so that its registers can be given to the consumers): each K
    step's cp.async copies into its slot once ``empty`` says the consumers are done with it, each thread arriving on
    ``full`` when its copies land."""
    _, wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = _sources(
        w_ptr, ws_ptr, x_ptr, ids_ptr, regions, _BM, _BN, _BK, _WARPS, _HELD
    )
    for i in range(reps):
        slot = i % _STAGES
        if i >= _STAGES:
            mbarrier.wait(empty.index(slot), ((i // _STAGES) - 1) & 1)
        g.issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, (i % _HELD) * _BK, wg_rows,
                             wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, _QK, _WARPS)  # fmt: skip
        cp.mbarrier_arrive(full.index(slot), increment_count=False)  # each lane's arrival, once its copies land


@gluon.jit
def decode_issue_ws_kernel(
    w_ptr, ws_ptr, x_ptr, ids_ptr, out_ptr, reps, regions,  # as decode_issue_kernel's
    GATE_THEN_UP: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,  # the producer warp group's registers a thread (setmaxnreg); consumers get the rest
):  # fmt: skip
    """The K step with its copies issued by warps of their own (warp specialization): WARPS consumer warps decode and
    multiply, WARPS producer warps copy (PRODUCER_REGS registers each), ``full`` and ``empty`` mbarriers a slot between
    them. (``warp_specialize`` takes a list of (function, arguments) in Triton 3.6 and 3.8.)"""
    wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s = g.gemm1_rings(_STAGES, _BM, _BN, _QK, _SK)
    full, empty = ws_barriers(_STAGES, _WARPS)
    consumer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, out_ptr, reps)
    producer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, w_ptr, ws_ptr, x_ptr, ids_ptr, reps,
                regions)  # fmt: skip
    if GATE_THEN_UP:
        gl.warp_specialize([(_ws_consumer_gu, consumer), (_ws_producer, producer)], [_WARPS], [PRODUCER_REGS])
    else:
        gl.warp_specialize([(_ws_consumer, consumer), (_ws_producer, producer)], [_WARPS], [PRODUCER_REGS])


def resident(kernel, sms_limit: int) -> int:
    """Programs per SM that registers, shared memory and warps let stay resident together (an H200: 65536
    registers, 227 KB of shared memory a SM for blocks, 64 warps)."""
    warps = kernel.metadata.num_warps
    by_regs = 65536 // (kernel.n_regs * 32 * warps) if kernel.n_regs else sms_limit
    by_shared = (227 * 1024) // max(1, kernel.metadata.shared)
    return min(by_regs, by_shared, 64 // warps, sms_limit)


def measure(launch, programs: int, per_sm: int, reps: int, bw: float, row: dict, reference):
    """Run ``launch(outs)`` once (it compiles; its accumulators are compared with ``reference``'s bits when given),
    then time it unless ``per_sm`` programs a SM do not fit. Returns (``row`` with the time, the rate and the bit
    check, printed; None when they do not fit) and the accumulators of the first run."""
    outs = torch.empty(programs, BLOCK_N, BLOCK_M, device="cuda", dtype=torch.float32)
    kernel = launch(outs)
    torch.cuda.synchronize()
    if not torch.isfinite(outs).all():
        raise RuntimeError("decode_issue: non-finite accumulators (a scale code out of range?)")
    same = None if reference is None else bool(torch.equal(reference, outs))
    label = f"  gate_then_up={row['gate_then_up']!s:5} {row['form']:7s} {per_sm} per SM"
    resources = f"{kernel.n_regs} registers, {kernel.metadata.num_warps} warps, {kernel.metadata.shared} B"
    if per_sm > resident(kernel, 4):
        print(f"{label}: do not fit ({resources})", flush=True)
        return None, outs
    ms = triton.testing.do_bench(lambda: launch(outs), warmup=10, rep=200, return_mode="median")
    rate = programs * reps * 2 * BLOCK_N * BLOCK_K / (ms * 1e-3)
    row.update(per_sm=per_sm, registers=kernel.n_regs, shared=kernel.metadata.shared, ms=ms, weights_per_s=rate,
               of_copy=rate * BYTES_PER_WEIGHT / bw, same_bits_as_copies=same)  # fmt: skip
    bits = "" if same is None else f" ({'same bits as' if same else 'OTHER BITS THAN'} the cp.async copies)"
    print(f"{label} ({resources}): {ms * 1e3:8.1f} us, {rate / 1e12:5.2f}e12 weights/s = {row['of_copy']:.0%} of the "
          f"copy bandwidth{bits}", flush=True)  # fmt: skip
    return row, outs


def main(out: Path) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(29)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = bench_real.copy_bandwidth()
    qk, sk = BLOCK_K // 4, BLOCK_K // 16
    w = torch.randint(
        -32768, 32768, (REGIONS, 2 * BLOCK_N, 2 * STAGES * qk), generator=gen, device=dev, dtype=torch.int32
    )
    w = w.to(torch.int16)
    scales = torch.rand(REGIONS, 2 * BLOCK_N, 2 * STAGES * sk, generator=gen, device=dev) * 2 + 0.25
    ws = nvfp4.scale_codes(scales.to(torch.float8_e4m3fn))  # the kernel layout's scale codes
    x = torch.randn(REGIONS, BLOCK_M, 2 * STAGES * BLOCK_K, generator=gen, device=dev).bfloat16()
    ids = torch.arange(BLOCK_M, device=dev, dtype=torch.int32)
    w_desc = TensorDescriptor.from_tensor(w.view(REGIONS * 2 * BLOCK_N, 2 * STAGES * qk), [BLOCK_N, qk],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_N, qk], gl.int16))  # fmt: skip
    print(
        f"{torch.cuda.get_device_name(dev)}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s = "
        f"{bw / BYTES_PER_WEIGHT / 1e12:.2f}e12 NVFP4 weights/s; triton {triton.__version__}",
        flush=True,
    )
    reps = 256
    rows = []
    copied = {}  # (gate_then_up, per_sm) -> the first copying form's accumulators: the others must match its bits
    for gate_then_up in (False, True):
        opts = {"maxnreg": 128} if gate_then_up else {}  # as the op compiles the 2-stage gate-then-up tile
        for form, (barrier, copy, use_tma) in FORMS.items():
            for per_sm in (1, 2, 3, 4):

                def launch(outs, programs=per_sm * sms, gate_then_up=gate_then_up, barrier=barrier, copy=copy,
                           use_tma=use_tma, opts=opts):  # fmt: skip
                    return decode_issue_kernel[(programs,)](
                        w, ws, x, ids, outs, w_desc, reps, REGIONS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                        WARPS=WARPS, STAGES=STAGES, LOOKAHEAD=1, GATE_THEN_UP=gate_then_up, BARRIER=barrier,
                        COPY=copy, TMA=use_tma, num_warps=WARPS, **opts,
                    )  # fmt: skip

                # the copies bring other K steps than the slots held: a wait too early shows in the bits
                reference = copied.get((gate_then_up, per_sm)) if copy else None
                row, outs = measure(launch, per_sm * sms, per_sm, reps, bw, {"gate_then_up": gate_then_up,
                                    "form": form}, reference)  # fmt: skip
                if copy and reference is None:
                    copied[(gate_then_up, per_sm)] = outs
                rows += [row] if row else []
    # The warp-specialized form (two stages only): its launch's register cap sets the programs per SM and, less the
    # producer's registers, the consumers' in their partition (the PTX's setmaxnreg, sm_90 AOT): 64 four per SM, the
    # consumers at 96 beside a producer of 32; 80 three, at 112 beside 48; 104 two, at 160 beside 48 (the interleaved
    # order needs about 160).
    for gate_then_up, cap, producer_regs in ((True, 64, 32), (True, 80, 48), (False, 104, 48)) if STAGES == 2 else ():
        for per_sm in (1, 2, 3, 4):

            def launch_ws(outs, programs=per_sm * sms, gate_then_up=gate_then_up, cap=cap, producer_regs=producer_regs):
                return decode_issue_ws_kernel[(programs,)](w, ws, x, ids, outs, reps, REGIONS,
                                                           GATE_THEN_UP=gate_then_up, PRODUCER_REGS=producer_regs,
                                                           num_warps=WARPS,
                                                           maxnreg=cap)  # fmt: skip

            row, _ = measure(launch_ws, per_sm * sms, per_sm, reps, bw, {"gate_then_up": gate_then_up,
                             "form": f"ws{cap}"}, copied.get((gate_then_up, per_sm)))  # fmt: skip
            rows += [row] if row else []
    (out / f"decode_issue_s{STAGES}.json").write_text(
        json.dumps({"gpu": torch.cuda.get_device_name(dev), "triton": triton.__version__, "copy_Bps": bw,
                    "tile": f"{BLOCK_M}x{BLOCK_N}x{BLOCK_K}-w{WARPS}-s{STAGES}-gl", "rows": rows}, indent=1) + "\n"
    )  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
