"""Experiment: the Gluon GEMMs with their copies issued by a warp group of their own (warp specialization), in the op.

``nvfp4_moe_gluon``'s kernels issue each K step's cp.async copies from the warps that then wait for them, decode and
multiply; run 42 (``decode_issue.py``) priced those copies at 15-20% of gemm1's K step with every byte in L2 (30% at
one program per SM). Here the same kernels (same arguments, grid, ring, decode, quarter wgmmas in the same order, same
epilogues and split sums, through the shipped helpers, so the same bits) are split in two partitions:

- the producer, PRODUCER_WARPS warps given PRODUCER_REGS registers a thread (``setmaxnreg``), computes the row
  pointers from the routing and issues each K step's copies into its ring slot once the slot's ``empty`` mbarrier
  says the consumers are done with it; each of its threads arrives on the slot's ``full`` mbarrier when its copies
  land (``cp.async.mbarrier.arrive.noinc``), so no thread waits on a copy group;
- the consumers (the launch's own warps, the rest of the registers) wait on ``full``, decode and multiply the slot,
  and release it (a barrier of their own warps, then one arrival on ``empty``); gemm1's epilogue follows in the
  launch's warps, gemm2's consumers store each N tile of y at its last K step as the shipped loop does.

The producer fills all STAGES slots ahead (the shipped ring refills the slot just consumed, so STAGES - 1 ahead), and
in gemm2 it runs into the next N tile while the consumers store the last. The whole op runs at real routing (top-8 of
256 experts, ``decode_cases.cases``) with the cached tiles and split plans, in each form of ``forms_of``: as shipped;
with each gemm1 form of FORMS in place of the Gluon gemm1 (``nvfp4_moe_gluon.nvfp4_moe_gemm1_gluon_kernel`` swapped for
the call); with the cached gemm2 tile in Gluon (the shipped Gluon gemm2, which lost to the Triton gemm2 in runs 31-39)
and each gemm2 form of FORMS2 in its place. Timings alternate between the forms (CUDA-graph replays, median of three),
with each GEMM's device time from the profiler, against the touched-experts floor; every form's output must have the
shipped bits (a Gluon gemm2's, at least those of the shipped Gluon gemm2). The gemm1 kernel is the package's
(``kernels/nvfp4_moe_gluon_ws.py``, moved there after run 43: a config marked ``-ws``, which the h200 cache takes at TP8
B = 7 and 8; at those steps "shipped" runs it already and the swap of the copy-issuing kernel does not reach it); the
gemm2 forms run in this script only. Results: bench/README.md, run 43.
Each warp-specialized form first runs once in a process of its own (``smoke``): one that hangs, fails or changes the
bits is left out of the timings, and the run goes on.
Usage: python bench/exp/ws_gemms.py OUT_DIR   (EXP_BATCHES, default 2,4,8,16,32,64,128,256; EXP_GEMMS, default
       gemm1,gemm2: whose forms to time)
       python bench/exp/ws_gemms.py --aot     (no GPU: registers, spills and shared memory of the forms, sm_90)
"""

import dataclasses
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
from sglang_glm5.kernels.nvfp4_moe_gluon_ws import (
    CONSUMER_LOOKAHEAD,
    nvfp4_moe_gemm1_ws_kernel,
    release_slot,
    ws_barriers,
)
from sglang_glm5.moe import fused_moe
from sglang_glm5.tiles import MoeConfig

BATCHES = [int(b) for b in os.environ.get("EXP_BATCHES", "2,4,8,16,32,64,128,256").split(",")]
GEMMS = os.environ.get("EXP_GEMMS", "gemm1,gemm2").split(",")  # whose warp-specialized forms to time
# (order, launch register cap, producer registers). The launch's cap times its 8 warps is the CTA's register budget: in
# the partitions the producer warp group takes its registers a thread and the consumers the rest (outside them the
# idle producer warps hold 24). So a cap of 64 keeps four programs per SM with the consumers at 96 registers beside a
# producer of 32 (the gate-then-up K loop without spills; the producer's loop spills 5 a step, 18 at 24 registers),
# 80 three, the consumers at 112 beside 48 (no spills in either loop), and 104 two, at 160 (what the interleaved order
# needs: it spills in its K loop at 112). sm_90 AOT, Triton 3.6 and 3.8 (``--aot``).
FORMS = {"ws-gu64": (True, 64, 32), "ws-gu80": (True, 80, 48), "ws-il104": (False, 104, 48)}
# gemm2's forms by the tile's rows (block_n, 4 warps): (launch register cap, producer registers), as gemm1's. 64 rows:
# four programs per SM (the consumers at 96 registers: 1-4 spills in the K loop) or three (112: none); 128 rows: two
# (208: none; at 112 or 96 the K loop spills 43-227). sm_90 AOT, Triton 3.6 and 3.8.
FORMS2 = {64: {"ws2-64": (64, 32), "ws2-80": (80, 48)}, 128: {"ws2-128": (128, 48)}}


@gluon.jit
def _consume2(w_s, s_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, k_steps, pid_m, pid_n, e64, wgs_ptr,
              topk_weights_ptr, sorted_ids_ptr, y_ptr, num_pairs, hidden_size, stride_yt):  # fmt: skip
    """gemm2's default partition: the shipped K step on each slot once ``full`` says it landed, ``empty`` after it,
    and at each N tile's last K step the tile of y (scaled as ``nvfp4_moe_gemm2_gluon_kernel`` scales it)."""
    STAGES: gl.constexpr = w_s.shape[0]
    BLOCK_N: gl.constexpr = w_s.shape[1]
    QK: gl.constexpr = w_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = g.mma_layout(BLOCK_M, WARPS)
    a_l: gl.constexpr = g.operand_layout(BLOCK_M, WARPS)
    programs = gl.num_programs(1)
    pair_ok, pair_safe, scale = g._gemm2_pairs(sorted_ids_ptr, topk_weights_ptr, wgs_ptr, e64, pid_m, num_pairs,
                                               BLOCK_M, mma)  # fmt: skip
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(full.index(slot), (i // STAGES) & 1)
        acc = g._gemm2_k_step(w_s, s_s, x0_s, x1_s, x2_s, x3_s, slot, acc, BLOCK_N, QK, CONSUMER_LOOKAHEAD, a_l)
        release_slot(empty, slot)
        if i % k_steps == k_steps - 1:  # the tile's last K step: store it, start the next
            g._gemm2_store(acc, pid_n + (i // k_steps) * programs, scale, pair_ok, pair_safe, y_ptr, hidden_size,
                           stride_yt, BLOCK_N, mma)  # fmt: skip
            acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)


@gluon.jit
def _produce2(w_s, s_s, x0_s, x1_s, x2_s, x3_s, full, empty, h_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m, pid_n,
              num_pairs, hidden_size, k_begin, k_steps, steps, stride_ht, stride_we, stride_wn, stride_se,
              stride_sn):  # fmt: skip
    """gemm2's worker partition: each step's copies (N tile pid_n + t * programs, K step kk) into its slot once
    ``empty`` frees it, arriving on ``full``; a tile's row pointers computed at its first step, as shipped."""
    STAGES: gl.constexpr = w_s.shape[0]
    BLOCK_N: gl.constexpr = w_s.shape[1]
    QK: gl.constexpr = w_s.shape[2]
    BLOCK_M: gl.constexpr = x0_s.shape[1]
    PRODUCER_WARPS: gl.constexpr = gl.num_warps()
    programs = gl.num_programs(1)
    w_base = w_ptr + e64 * stride_we
    s_base = ws_ptr + e64 * stride_se
    x_rows, x_ok = g._activation_rows(h_ptr, sorted_ids_ptr, pid_m, num_pairs, 1, stride_ht, BLOCK_M, QK,
                                      PRODUCER_WARPS)  # fmt: skip
    w_rows, s_rows = g._tile_rows(w_base, s_base, pid_n, stride_wn, stride_sn, hidden_size, BLOCK_N, QK,
                                  PRODUCER_WARPS)  # fmt: skip
    for i in range(steps):
        kk = i % k_steps
        if i > 0 and kk == 0:  # a tile's first step
            w_rows, s_rows = g._tile_rows(w_base, s_base, pid_n + (i // k_steps) * programs, stride_wn, stride_sn,
                                          hidden_size, BLOCK_N, QK, PRODUCER_WARPS)  # fmt: skip
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), ((i // STAGES) - 1) & 1)
        g._issue_gemm2_copies(w_s, s_s, x0_s, x1_s, x2_s, x3_s, slot, k_begin + kk * 4 * QK, w_rows, s_rows, x_rows,
                              x_ok, QK, PRODUCER_WARPS)  # fmt: skip
        cp.mbarrier_arrive(full.index(slot), increment_count=False)


@gluon.jit
def nvfp4_moe_gemm2_ws_kernel(
    h_ptr, w_ptr, ws_ptr, wgs_ptr, topk_weights_ptr, sorted_ids_ptr, block_expert_ptr, y_ptr,
    num_pairs, hidden_size, inter_size, k_per_split,
    stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_yt,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOOKAHEAD: gl.constexpr, SPLITS: gl.constexpr, PDL: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr = 4, PRODUCER_REGS: gl.constexpr = 48,  # as nvfp4_moe_gemm1_ws_kernel's
):  # fmt: skip
    """``nvfp4_moe_gluon.nvfp4_moe_gemm2_gluon_kernel``'s arguments, grid and results (its loop over (N tile, K step)
    steps) with the copies on a producer warp group, as ``nvfp4_moe_gemm1_ws_kernel`` does for gemm1."""
    gl.static_assert(
        LOOKAHEAD == CONSUMER_LOOKAHEAD, "the consumer partition keeps CONSUMER_LOOKAHEAD quarters in flight"
    )
    QK: gl.constexpr = BLOCK_K // 4
    SK: gl.constexpr = BLOCK_K // 16
    pid_m, pid_n, expert = g.program_block(block_expert_ptr, PDL)
    if expert >= 0:
        e64 = expert.to(gl.int64)
        w_s, s_s, x0_s, x1_s, x2_s, x3_s = g._gemm2_rings(STAGES, BLOCK_M, BLOCK_N, QK, SK)
        full, empty = ws_barriers(STAGES, PRODUCER_WARPS)
        k_begin, k_steps = g.k_slice(inter_size, k_per_split, BLOCK_K, SPLITS)
        if SPLITS > 1:
            y_ptr += gl.program_id(2).to(gl.int64) * num_pairs * stride_yt
        steps = gl.cdiv(gl.cdiv(hidden_size, BLOCK_N) - pid_n, gl.num_programs(1)) * k_steps
        consumer = (w_s, s_s, x0_s, x1_s, x2_s, x3_s, full, empty, steps, k_steps, pid_m, pid_n, e64, wgs_ptr,
                    topk_weights_ptr, sorted_ids_ptr, y_ptr, num_pairs, hidden_size, stride_yt)  # fmt: skip
        producer = (w_s, s_s, x0_s, x1_s, x2_s, x3_s, full, empty, h_ptr, w_ptr, ws_ptr, sorted_ids_ptr, e64, pid_m,
                    pid_n, num_pairs, hidden_size, k_begin, k_steps, steps, stride_ht, stride_we, stride_wn,
                    stride_se, stride_sn)  # fmt: skip
        gl.warp_specialize([(_consume2, consumer), (_produce2, producer)], [PRODUCER_WARPS], [PRODUCER_REGS])
        if PDL:
            g.grid_dependency(False)


class InPlace:
    """Stands in for a shipped Gluon kernel during a call: ``[grid](...)`` launches ``kernel`` with the same arguments
    and ``overrides`` (constexprs, launch options) on top."""

    def __init__(self, kernel, **overrides):
        self.kernel, self.overrides = kernel, overrides

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return self.kernel[grid](*args, **{**kwargs, **self.overrides})

        return launch


def with_kernel(attr: str, kernel, fn):
    """Run ``fn()`` with ``kernel`` as ``nvfp4_moe_gluon``'s ``attr`` (None: the shipped kernel); returns its result."""
    shipped = getattr(g, attr)
    if kernel is not None:
        setattr(g, attr, kernel)
    try:
        return fn()
    finally:
        setattr(g, attr, shipped)


def aot(kernel: str, tile: str, splits: int, maxnreg: int, producer_regs: int, arch: int = 90):
    """The warp-specialized ``kernel`` ("gemm1" or "gemm2") compiled ahead of time for ``sm_{arch}`` (no GPU) with a
    shipped tile label, as ``w4a16_gluon.aot`` compiles the shipped ones: (registers a thread from ptxas, spills, the
    K loop's instructions and spills, shared bytes, the PTX)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_glm5.tiles import GemmConfig
    from sglang_glm5.variants import w4a16_gluon as wg

    t = GemmConfig.from_label(tile)
    fn = {"gemm1": nvfp4_moe_gemm1_ws_kernel, "gemm2": nvfp4_moe_gemm2_ws_kernel}[kernel]
    consts = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "WARPS": t.num_warps, "BLOCK_K": t.block_k,
              "STAGES": t.num_stages, "LOOKAHEAD": wg.LOOKAHEAD, "SPLITS": splits, "PDL": True, "PRODUCER_WARPS": 4,
              "PRODUCER_REGS": producer_regs}  # fmt: skip
    if kernel == "gemm1":
        consts.update(GATE_THEN_UP=t.gate_then_up, BLOCKS_LAST=False, READY=False)
    pointers = {**wg._POINTERS, "y_ptr": "*fp32" if splits > 1 else "*bf16"}
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
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


GEMM1, GEMM2 = "nvfp4_moe_gemm1_gluon_kernel", "nvfp4_moe_gemm2_gluon_kernel"


def forms_of(cfg: MoeConfig) -> dict[str, tuple[MoeConfig, str, InPlace | None]]:
    """What a case times: {name: (the op's tiles, the Gluon kernel swapped, its stand-in or None)}. "shipped" is the
    cached tiles as the op runs them; with a Gluon gemm1, each gemm1 form of FORMS; with a decode gemm2 tile of
    FORMS2, that tile in Gluon ("gemm2-gl": the shipped Gluon gemm2, which the tuner does not offer) and each of its
    warp-specialized forms (the same tile and plan)."""
    forms: dict[str, tuple[MoeConfig, str, InPlace | None]] = {"shipped": (cfg, GEMM1, None)}
    if cfg.gemm1.gluon and "gemm1" in GEMMS:
        for name, (gate_then_up, cap, producer_regs) in FORMS.items():
            if name not in SKIP:
                forms[name] = (cfg, GEMM1, InPlace(nvfp4_moe_gemm1_ws_kernel, GATE_THEN_UP=gate_then_up,
                                                   PRODUCER_REGS=producer_regs, maxnreg=cap))  # fmt: skip
    if "gemm2" in GEMMS and cfg.gemm2.gluon_takes and cfg.gemm2.num_warps == 4 and cfg.gemm2.block_n in FORMS2:
        cfg2 = MoeConfig(cfg.gemm1, dataclasses.replace(cfg.gemm2, gluon=True))
        forms["gemm2-gl"] = (cfg2, GEMM2, None)
        for name, (cap, producer_regs) in FORMS2[cfg.gemm2.block_n].items():
            if name not in SKIP:
                forms[name] = (cfg2, GEMM2, InPlace(nvfp4_moe_gemm2_ws_kernel, PRODUCER_REGS=producer_regs,
                                                    maxnreg=cap))  # fmt: skip
    return forms


def compare(name: str, batch: int, cfg: MoeConfig, bundles, inputs, floor: float) -> dict:
    """One case: the op in each of ``forms_of(cfg)``: the bits of the first input's output against "shipped"'s (and a
    gemm2 form's against "gemm2-gl"'s), median ms of three alternating CUDA-graph timings, each GEMM's device us."""
    x, w, ids = inputs[0]

    def once(tiles):
        return lambda: fused_moe(x, bundles[0], w, ids, config=tiles, **OP_KWARGS)

    def op(tiles):
        def run():
            for i, (xi, wi, idsi) in enumerate(inputs):
                fused_moe(xi, bundles[i % 2], wi, idsi, config=tiles, **OP_KWARGS)

        return run

    forms = forms_of(cfg)
    out = {form: with_kernel(attr, kernel, once(tiles)) for form, (tiles, attr, kernel) in forms.items()}
    same = {form: bool(torch.equal(y, out["shipped"])) for form, y in out.items()}
    same_gl = {form: bool(torch.equal(y, out[reference(form)])) for form, y in out.items() if form.startswith("ws2")}
    ms: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(3):  # alternating, so that a drift of the GPU's clocks falls on every form alike
        for form, (tiles, attr, kernel) in forms.items():
            ms[form].append(with_kernel(attr, kernel, lambda t=tiles: bench_real._time(op(t), True, len(inputs))))
    us = {}
    for form, (tiles, attr, kernel) in forms.items():
        us[form] = with_kernel(attr, kernel, lambda t=tiles: kernel_us(op(t), len(inputs)))
    med = {form: sorted(v)[1] for form, v in ms.items()}
    text = "\n  ".join(
        f"{form:9s} {v:.4f} ms ({v / med['shipped']:.3f}x, {floor / v:.0%} of floor; gemm1 "
        f"{us[form].get('gemm1', 0):.1f} us, gemm2 {us[form].get('gemm2', 0):.1f} us)"
        f"{'' if same[form] else ' other bits than shipped'}"
        f"{'' if same_gl.get(form, True) else ', OTHER BITS THAN gemm2-gl'}"
        for form, v in med.items()
    )
    print(f"{name} B={batch} {cfg.gemm1.label} / {cfg.gemm2.label}:\n  {text}", flush=True)
    return {"layout": name, "batch": batch, "tiles": [cfg.gemm1.label, cfg.gemm2.label], "floor_ms": floor,
            "op_ms": med, "op_ms_all": ms, "kernel_us": us, "same_bits_as_shipped": same,
            "same_bits_as_gemm2_gl": same_gl, "of_floor": {form: floor / v for form, v in med.items()}}  # fmt: skip


SMOKE_S = 150  # seconds a form's first call may take in a process of its own (compiles included) before it is hung
SKIP: set[str] = set()  # forms that failed their smoke run: ``forms_of`` leaves them out


def reference(form: str) -> str:
    """The form whose bits ``form``'s must have: a warp-specialized gemm2's, the same tile in the shipped Gluon
    gemm2; every other form's, the shipped op."""
    return "gemm2-gl" if form.startswith("ws2") else "shipped"


def smoke_form(form: str) -> int:
    """``--smoke FORM``, in a process of its own: one op call with ``form`` on the first EP8 case (B = 64, then 128)
    whose cached tiles it takes, synchronized, against its reference's bits. 0: the same bits; 3: other bits; 4: no case
    takes it (an error exits 1). A form that hangs is killed by ``smoke``'s timeout."""
    for _, layout, bundles, batch, inputs in cases(generator(43), (64, 128)):
        forms = forms_of(cached_config(layout, batch))
        if form in forms:
            x, w, ids = inputs[0]
            layer = bundles[0]
            outs = {}
            for name in (reference(form), form):
                tiles, attr, kernel = forms[name]
                outs[name] = with_kernel(attr, kernel, lambda t=tiles, x=x, layer=layer, w=w, ids=ids: fused_moe(
                    x, layer, w, ids, config=t, **OP_KWARGS))  # fmt: skip
            torch.cuda.synchronize()
            return 0 if torch.equal(outs[form], outs[reference(form)]) else 3
    return 4


def smoke() -> None:
    """Each warp-specialized form of GEMMS once in a process of its own (``smoke_form``), so that a form that hangs or
    fails costs SMOKE_S seconds, not the run: the ones that do not pass go into SKIP."""
    import subprocess

    names = [*FORMS] * ("gemm1" in GEMMS) + [n for forms in FORMS2.values() for n in forms] * ("gemm2" in GEMMS)
    for name in names:
        try:
            rc = subprocess.run([sys.executable, __file__, "--smoke", name], timeout=SMOKE_S).returncode
            verdict = {0: "same bits", 3: "OTHER BITS", 4: "no case takes it"}.get(rc, f"failed (exit {rc})")
        except subprocess.TimeoutExpired:
            rc, verdict = -1, f"HUNG (killed after {SMOKE_S} s)"
        print(f"smoke {name}: {verdict}", flush=True)
        if rc not in (0, 4):
            SKIP.add(name)


def main(out: Path) -> None:
    smoke()
    gen = generator(43)
    bw = bench_real.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, triton {triton.__version__}",
          flush=True)  # fmt: skip
    rows = []
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        cfg = cached_config(layout, batch)
        if len(forms_of(cfg)) == 1:
            print(f"{name} B={batch}: no form of {', '.join(GEMMS)} takes the cached tiles ({cfg.gemm1.label}, "
                  f"{cfg.gemm2.label}); skipped", flush=True)  # fmt: skip
            continue
        rows.append(compare(name, batch, cfg, bundles, inputs, floor_ms(inputs, layout, bw)))
        # after every case, so that a run cut short keeps what it measured
        (out / f"ws_{'_'.join(GEMMS)}.json").write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_Bps": bw, "rows": rows,
        }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--aot"]:
        forms2 = {name: form for forms in FORMS2.values() for name, form in forms.items()}
        for kernel, tiles, forms in (("gemm1", ("16x64x256-w4-s2-gl", "16x64x256-w4-s3-gl"), FORMS),
                                     ("gemm2", ("16x64x256-w4-s3-gl", "16x128x256-w4-s3-gl"), forms2)):  # fmt: skip
            for tile in tiles:
                for splits in (1, 3):
                    for name, form in forms.items():
                        label = tile + ("-gu" if kernel == "gemm1" and form[0] else "")
                        regs, spills, loop, loop_spills, shared, ptx = aot(kernel, label, splits, *form[-2:])
                        nreg = sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
                        print(f"{kernel} {name} {label} splits={splits}: {regs} registers at launch, setmaxnreg "
                              f"{nreg}, {spills} local loads and stores ({loop_spills} in the {loop}-instruction K "
                              f"loop), {shared} B")  # fmt: skip
    elif sys.argv[1:2] == ["--smoke"]:
        sys.exit(smoke_form(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
