"""Experiment: the Gluon gemm1 with its copies issued by a warp group of its own (warp specialization), in the op.

``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel``'s warps issue each K step's cp.async copies, wait for them, and then
decode and multiply; run 42 (``decode_issue.py``) priced those copies at 15-20% of the K step with every byte in L2
(30% at one program per SM). Here the same gemm1 (same arguments, ring, decode, quarter wgmmas in the same order, same
epilogue and split sums, so the same bits) is split in two partitions:

- the producer, PRODUCER_WARPS warps given PRODUCER_REGS registers a thread (``setmaxnreg``), computes the row
  pointers from the routing and issues each K step's copies into its ring slot once the slot's ``empty`` mbarrier
  says the consumers are done with it; each of its threads arrives on the slot's ``full`` mbarrier when its copies
  land (``cp.async.mbarrier.arrive.noinc``), so no thread waits on a copy group;
- the consumer (the launch's own warps, the rest of the registers) waits on ``full``, decodes and multiplies the
  slot, and releases it (a barrier of its own warps, then one arrival on ``empty``); then the epilogue, as shipped.

The producer fills all STAGES slots ahead (the shipped ring refills the slot just consumed, so STAGES - 1 ahead).
The whole op runs at real routing (top-8 of 256 experts, ``decode_cases.cases``) with the cached tiles, once with the
shipped gemm1 and once with this one in its place (``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel`` swapped for the
call), in alternating CUDA-graph timings; the two outputs must have the same bits. Rows for each B whose cached gemm1
tile is a Gluon one: op ms of both, their ratio, gemm1's device us of both (profiler), against the touched-experts
floor, for each form of FORMS (an order, a register cap, the producer's registers). Nothing here runs in the op
outside this script.
Usage: python bench/exp/ws_gemm1.py OUT_DIR   (EXP_BATCHES, default 2,4,8,16,32,64,128,256)
       python bench/exp/ws_gemm1.py --aot     (no GPU: registers, spills and shared memory of the forms, sm_90)
"""

import json
import os
import re
import sys
from pathlib import Path

import torch
import triton
from decode_cases import OP_KWARGS, cached_config, cases, floor_ms, generator, kernel_us
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from sglang_glm5 import bench_real
from sglang_glm5.kernels import nvfp4_moe_gluon as g
from sglang_glm5.moe import fused_moe

BATCHES = [int(b) for b in os.environ.get("EXP_BATCHES", "2,4,8,16,32,64,128,256").split(",")]
_LOOKAHEAD = gl.constexpr(1)  # quarters of wgmmas in flight while the next is decoded, as the op launches gemm1
# (order, launch register cap, producer registers). The launch's cap times its 8 warps is the CTA's register budget: in
# the partitions the producer warp group takes its registers a thread and the consumers the rest (outside them the
# idle producer warps hold 24). So a cap of 64 keeps four programs per SM with the consumers at 96 registers beside a
# producer of 32 (the gate-then-up K loop without spills; the producer's loop spills 5 a step, 18 at 24 registers),
# 80 three, the consumers at 112 beside 48 (no spills in either loop), and 104 two, at 160 (what the interleaved order
# needs: it spills in its K loop at 112). sm_90 AOT, Triton 3.6 and 3.8 (``--aot``).
FORMS = {"ws-gu64": (True, 64, 32), "ws-gu80": (True, 80, 48), "ws-il104": (False, 104, 48)}


@gluon.jit
def _consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, GATE_THEN_UP: gl.constexpr):
    """The default partition's K loop: the shipped K step on each slot once ``full`` says it landed, then ``empty``.
    Returns the accumulators of gate and up. (A partition's arguments reach it as values, not constexprs: the tile's
    sizes come from the rings' shapes and the partition's warps.)"""
    STAGES: gl.constexpr = wg_s.shape[0]
    BLOCK_N: gl.constexpr = wg_s.shape[1]
    QK: gl.constexpr = wg_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = g._mma_layout(BLOCK_M, WARPS)
    a_l: gl.constexpr = g._operand_layout(BLOCK_M, WARPS)
    acc_g = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    acc_u = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(full.index(slot), (i // STAGES) & 1)
        acc_g, acc_u = g._gemm1_k_step(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, acc_g, acc_u, BLOCK_N, QK,
                                       _LOOKAHEAD, GATE_THEN_UP, a_l)  # fmt: skip
        g._cta_barrier()  # every consumer warp is done with the slot (a barrier of this partition's warps)
        mbarrier.arrive(empty.index(slot))
    return acc_g, acc_u


@gluon.jit
def _consume_interleaved(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps):
    return _consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, False)


@gluon.jit
def _consume_gate_then_up(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps):
    return _consume(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, True)


@gluon.jit
def _produce(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr,
             e64, pid_m, pid_n, num_pairs, top_k, inter_size, k_begin, steps, stride_xt, stride_we, stride_wn,
             stride_se, stride_sn, gate_row0, up_row0):  # fmt: skip
    """The worker partition: the row pointers (as the shipped kernel builds them, in its copy layouts on this
    partition's warps), then each K step's copies into its slot once ``empty`` frees it, arriving on ``full``."""
    STAGES: gl.constexpr = wg_s.shape[0]
    BLOCK_N: gl.constexpr = wg_s.shape[1]
    QK: gl.constexpr = wg_s.shape[2]
    SK: gl.constexpr = sg_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    BLOCK_K: gl.constexpr = 4 * QK
    PRODUCER_WARPS: gl.constexpr = gl.num_warps()
    wg_rows, wu_rows, sg_rows, su_rows, w_cols, s_cols, x_rows, x_ok = g._gemm1_sources(
        x_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m, pid_n, num_pairs, top_k, inter_size, stride_xt, stride_we,
        stride_wn, stride_se, stride_sn, gate_row0, up_row0, BLOCK_M, BLOCK_N, QK, SK, PRODUCER_WARPS)  # fmt: skip
    for i in range(steps):
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), ((i // STAGES) - 1) & 1)
        g._issue_gemm1_copies(wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, slot, k_begin + i * BLOCK_K, wg_rows,
                              wu_rows, sg_rows, su_rows, x_rows, w_cols, s_cols, x_ok, QK,
                              PRODUCER_WARPS)  # fmt: skip
        cp.mbarrier_arrive(full.index(slot), increment_count=False)  # this thread's arrival, once its copies land


@gluon.jit
def nvfp4_moe_gemm1_ws_kernel(
    x_ptr, w_ptr, ws_ptr, wgs_ptr, sorted_ids_ptr, block_expert_ptr, h_ptr, part_ptr, counter_ptr, ready_ptr,
    num_pairs, top_k, inter_size, hidden_size, k_per_split,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_gse, stride_gsg, stride_ht, gate_row0, up_row0,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOOKAHEAD: gl.constexpr, GATE_THEN_UP: gl.constexpr, SPLITS: gl.constexpr, PDL: gl.constexpr,
    BLOCKS_LAST: gl.constexpr, READY: gl.constexpr = False,
    PRODUCER_WARPS: gl.constexpr = 4,  # the copying partition's warps (a warp group: setmaxnreg works on those)
    PRODUCER_REGS: gl.constexpr = 48,  # its registers a thread
):  # fmt: skip
    """``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel``'s arguments, grid and results; WARPS consumer warps (the
    launch's num_warps) and PRODUCER_WARPS more."""
    gl.static_assert(LOOKAHEAD == _LOOKAHEAD, "the consumer partition keeps _LOOKAHEAD quarters in flight")
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    pid_m, pid_n, expert = g._program_block(block_expert_ptr, PDL, BLOCKS_LAST)
    if PDL and READY:
        g._griddepcontrol(False)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s = g._gemm1_rings(STAGES, BLOCK_M, BLOCK_N, QK, SK)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(STAGES):
            mbarrier.init(full.index(b), count=32 * PRODUCER_WARPS)  # every producer thread arrives
            mbarrier.init(empty.index(b), count=1)  # one consumer thread arrives, after the consumers' barrier

        k_begin, steps = g._k_slice(hidden_size, k_per_split, BLOCK_K, SPLITS)
        consumer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps)
        producer = (wg_s, wu_s, sg_s, su_s, x0_s, x1_s, x2_s, x3_s, full, empty, x_ptr, w_ptr, ws_ptr, sorted_ids_ptr,
                    e64, pid_m, pid_n, num_pairs, top_k, inter_size, k_begin, steps, stride_xt, stride_we,
                    stride_wn, stride_se, stride_sn, gate_row0, up_row0)  # fmt: skip
        if GATE_THEN_UP:
            acc_g, acc_u = gl.warp_specialize([(_consume_gate_then_up, consumer), (_produce, producer)],
                                              [PRODUCER_WARPS], [PRODUCER_REGS])  # fmt: skip
        else:
            acc_g, acc_u = gl.warp_specialize([(_consume_interleaved, consumer), (_produce, producer)],
                                              [PRODUCER_WARPS], [PRODUCER_REGS])  # fmt: skip
        if PDL and not READY:
            g._griddepcontrol(False)

        g._gemm1_finish(acc_g, acc_u, pid_m, pid_n, e64, wgs_ptr, sorted_ids_ptr, h_ptr, part_ptr, counter_ptr,
                        ready_ptr, num_pairs, inter_size, stride_gse, stride_gsg, stride_ht, BLOCK_M, BLOCK_N, WARPS,
                        SPLITS, BLOCKS_LAST, READY)  # fmt: skip


class _WsInPlace:
    """Stands in for ``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel`` during a call: ``[grid](...)`` launches the
    warp-specialized kernel with the same arguments, in the order ``gate_then_up`` (the same bits in either order),
    under the register cap ``maxnreg``, with ``producer_regs`` registers a producer thread."""

    def __init__(self, gate_then_up: bool, maxnreg: int, producer_regs: int):
        self.gate_then_up, self.maxnreg, self.producer_regs = gate_then_up, maxnreg, producer_regs

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kwargs.update(GATE_THEN_UP=self.gate_then_up, PRODUCER_REGS=self.producer_regs, maxnreg=self.maxnreg)
            return nvfp4_moe_gemm1_ws_kernel[grid](*args, **kwargs)

        return launch


def with_gemm1(kernel, fn):
    """Run ``fn()`` with ``kernel`` as the op's Gluon gemm1 (None: the shipped one); returns its result."""
    shipped = g.nvfp4_moe_gemm1_gluon_kernel
    if kernel is not None:
        g.nvfp4_moe_gemm1_gluon_kernel = kernel
    try:
        return fn()
    finally:
        g.nvfp4_moe_gemm1_gluon_kernel = shipped


def aot(tile: str, splits: int, maxnreg: int, producer_regs: int, arch: int = 90):
    """The warp-specialized kernel compiled ahead of time for ``sm_{arch}`` (no GPU) with a shipped tile label, as
    ``w4a16_gluon.aot`` compiles the shipped one: (registers a thread from ptxas, shared bytes, the PTX)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_glm5.tiles import GemmConfig
    from sglang_glm5.variants import w4a16_gluon as wg

    t = GemmConfig.from_label(tile)
    fn = nvfp4_moe_gemm1_ws_kernel
    consts = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "WARPS": t.num_warps, "BLOCK_K": t.block_k,
              "STAGES": t.num_stages, "LOOKAHEAD": wg.LOOKAHEAD, "GATE_THEN_UP": t.gate_then_up, "SPLITS": splits,
              "PDL": True, "BLOCKS_LAST": False, "READY": False, "PRODUCER_WARPS": 4,
              "PRODUCER_REGS": producer_regs}  # fmt: skip
    sig = {a: "constexpr" if a in consts else wg._POINTERS.get(a, "i32") for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a] != "constexpr" and a not in wg._NOT_DIVISIBLE}  # fmt: skip
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": t.num_warps, "maxnreg": maxnreg})
    return *_resources(k.asm["cubin"]), k.metadata.shared, k.asm["ptx"]


def _resources(cubin: bytes) -> tuple[int, int, int, int]:
    """The registers a thread a cubin's kernel was given (cuobjdump's resource usage; with setmaxnreg the launch's),
    the local-memory loads and stores in its SASS (register spills), and the consumers' K loop's instructions and
    spills (``aot_load_forms.k_loop``: the loop around the wgmmas)."""
    import subprocess
    import tempfile

    from aot_load_forms import k_loop

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    loop = k_loop(sass)
    spills_in_loop = sum(bool(re.search(r"\b(?:LDL|STL)\b", line)) for line in loop)
    spills = len(re.findall(r"\b(?:LDL|STL)\b", sass))
    return int(re.search(r"REG:(\d+)", usage).group(1)), spills, len(loop), spills_in_loop


def compare(name: str, batch: int, cfg, bundles, inputs, floor: float) -> dict:
    """One case: the op with the shipped gemm1 and with each form of FORMS in its place (same tiles and split plan),
    the bits of the first input's output, median ms of three alternating CUDA-graph timings, gemm1's device us."""
    x, w, ids = inputs[0]

    def once():
        return fused_moe(x, bundles[0], w, ids, config=cfg, **OP_KWARGS)

    def op():
        for i, (xi, wi, idsi) in enumerate(inputs):
            fused_moe(xi, bundles[i % 2], wi, idsi, config=cfg, **OP_KWARGS)

    forms = {"shipped": None, **{form: _WsInPlace(*spec) for form, spec in FORMS.items()}}
    want = with_gemm1(None, once)
    same = {form: bool(torch.equal(with_gemm1(kernel, once), want)) for form, kernel in forms.items()}
    ms: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(3):  # alternating, so that a drift of the GPU's clocks falls on every form alike
        for form, kernel in forms.items():
            ms[form].append(with_gemm1(kernel, lambda: bench_real._time(op, True, len(inputs))))
    us1 = {}
    for form, kernel in forms.items():
        us1[form] = with_gemm1(kernel, lambda: kernel_us(op, len(inputs))).get("gemm1")
    med = {form: sorted(v)[1] for form, v in ms.items()}
    text = ", ".join(
        f"{form} {v:.4f} ms ({v / med['shipped']:.3f}x, {floor / v:.0%} of floor, gemm1 {us1[form]:.1f} us"
        f"{'' if same[form] else ', OTHER BITS'})"
        for form, v in med.items()
    )
    print(f"{name} B={batch} {cfg.gemm1.label}: {text}", flush=True)
    return {"layout": name, "batch": batch, "tile": cfg.gemm1.label, "floor_ms": floor, "op_ms": med, "op_ms_all": ms,
            "gemm1_us": us1, "same_bits": same, "of_floor": {form: floor / v for form, v in med.items()}}  # fmt: skip


def main(out: Path) -> None:
    gen = generator(43)
    bw = bench_real.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, triton {triton.__version__}",
          flush=True)  # fmt: skip
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        cfg = cached_config(layout, batch)
        if not cfg.gemm1.gluon:
            print(f"{name} B={batch}: cached gemm1 {cfg.gemm1.label} is not a Gluon tile; skipped", flush=True)
            continue
        rows.append(compare(name, batch, cfg, bundles, inputs, floor_ms(inputs, layout, bw)))
    (out / "ws_gemm1.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                                                   "copy_Bps": bw, "rows": rows}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--aot"]:
        for tile in ("16x64x256-w4-s2-gl", "16x64x256-w4-s3-gl"):
            for splits in (1, 3):
                for name, (gate_then_up, cap, producer_regs) in FORMS.items():
                    label = tile + ("-gu" if gate_then_up else "")
                    regs, spills, loop, loop_spills, shared, ptx = aot(label, splits, cap, producer_regs)
                    nreg = sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
                    print(f"{name} {label} splits={splits}: {regs} registers at launch, setmaxnreg {nreg}, {spills} "
                          f"local loads and stores ({loop_spills} in the {loop}-instruction K loop), "
                          f"{shared} B")  # fmt: skip
    else:
        main(Path(sys.argv[1]))
