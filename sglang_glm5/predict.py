"""A decode step's time, part by part, and the tok/s that follows: ``sglang-glm5 plan --predict``.

A prediction, not a measurement: no SM120 GPU has run any of it. Every number the model uses is in ``CONSTANTS``
with its source; the formulas and the calibration are in docs/predict.md. Per pass (a decode step, or with MTP a
verify pass of d = steps + 1 tokens a request and the draft's passes), on one GPU of the layout:

- routed MoE layers: our op's H200 time per layer at real routing (bench record at 00e4ba9) split into a fixed part
  and the rest; on the target the rest is the slower of the touched experts' bytes at the target's copy bandwidth and
  the H200's rest scaled by SM count (the roofline of the two); touched experts per rank from the routing's
  expectation (under EP the slowest of the ranks);
- shared expert, dense layers, attention projections, indexer, router, LM head: BF16 bytes at the bandwidth, or
  their FLOPs at the peak, whichever is longer, both at one stated efficiency;
- attention over the KV cache (MLA latents of the DSA top-k tokens, the indexer's keys of the whole context);
- collectives: latency + size / bus bandwidth per NCCL call of the layout (``plan.collectives``), and beside it
  the all-reduces as a one-shot PCIe all-reduce;
- a fixed cost per step (graph launch, sampling, scheduler): fitted on the published SGLang CUTLASS table once the
  NCCL latency is fitted on the published one-shot all-reduce gain (``fit_constants``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_glm5.hardware import TARGETS, GpuTarget
from sglang_glm5.plan import (
    BF16,
    ModelShape,
    Plan,
    attention_weights,
    collectives,
    kv_bytes_per_token,
    load_model_config,
    make_plan,
    shared_expert_split,
)
from sglang_glm5.profiles import load_profile

REVISION = "step model r1 (sglang-glm5 predict.py)"
CONCURRENCY = (1, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 1024 + 256  # `loadtest run`'s default request: 1,024 prompt + 256 output tokens
GPUS = ("rtx-pro-6000", "h100", "h200")
MOE_KERNELS = ("ours", "cutlass", "b12x", "floor")  # floor: the touched experts' bytes at the copy bandwidth
NVFP4_BYTES = 0.5 + 1 / 16  # a weight's e2m1 nibble and its share of the e4m3 scale per 16


@dataclass(frozen=True)
class Constant:
    value: float
    unit: str
    source: str


def _c(value: float, unit: str, source: str) -> Constant:
    return Constant(value, unit, source)


REC = "bench record at 00e4ba9"
CONSTANTS: dict[str, Constant] = {
    "copy_over_datasheet": _c(
        0.881,
        "x",
        f"H200 device copy 4.23 TB/s (read + write; {REC}, "
        "bench/h200/runs/run49_bench_real_h200_seed43.json floors) over its 4.8 TB/s datasheet; "
        "the H100's 3.00 TB/s / 3.35 is 0.90 (bench/h200/runs/run51_bench_real_h100_seed43.json)",
    ),
    "moe_fixed": _c(
        8.2e-6,
        "s",
        f"{REC}, bench/h200/runs/run41_read_floor.json: one expert's bytes read in the op's four "
        "launches 13.22 us against its 5.03 us floor",
    ),
    "moe_byte_eff": _c(
        0.93,
        "x copy",
        f"{REC}, bench/h200/runs/run41_chain_fit.json: an added expert decoded at 93% of "
        "the copy bandwidth (EP8 T = 8, 16)",
    ),
    "dense_eff": _c(
        0.80,
        "x datasheet",
        "b12x's dense FP4 GEMM at M = 9: 78-92% of 1.79 TB/s (shared/FACTS.md, "
        "b12x PR #267), low end; used for every BF16 weight read, the KV reads and the peak FLOPs",
    ),
    "cutlass_byte_eff": _c(
        0.585,
        "x datasheet",
        "FlashInfer CUTLASS FP4 GEMM at M = 9: 52-65% of 1.79 TB/s, the "
        "midpoint (same b12x comparison, shared/FACTS.md)",
    ),
    "cutlass_tile_rows": _c(
        128,
        "rows",
        "FlashInfer CUTLASS MoE on SM120 pads each touched expert's rows to a "
        "128-row tile (shared/FACTS.md, voipmonitor/rtx6kpro models/glm5.md)",
    ),
    "b12x_layer": _c(
        32.8e-6,
        "s",
        "b12x MoE layer at M = 1, cold L2, E = 288, K = 4096, N = 512, top-8 (b12x PR #267, shared/FACTS.md)",
    ),
    "b12x_byte_eff": _c(0.85, "x datasheet", "b12x dense FP4 GEMM 78-92% of 1.79 TB/s, the midpoint (shared/FACTS.md)"),
    "nccl_busbw": _c(
        39e9, "B/s", "8-GPU NCCL all-reduce bus bandwidth on RTX PRO 6000 PCIe, 37-41 GB/s (shared/FACTS.md)"
    ),
    "nccl_latency_published": _c(
        45e-6,
        "s",
        "NCCL all-reduce of 4 KB on 8 PCIe RTX 6000-class cards (sglang "
        "#32479); the same issue's 344 us at 64 KB is not on this latency + size line",
    ),
    "oneshot_latency": _c(
        6.1e-6,
        "s",
        "one-shot PCIe all-reduce of 1 KB on 4 GPUs (rtx6kpro optimization/pcie-oneshot-allreduce.md, shared/FACTS.md)",
    ),
    "oneshot_p2p": _c(
        34.5e9, "B/s", "the same: 64 KB in 11.8 us on 4 GPUs, each reading 3 peers' 64 KB in the 5.7 us over 1 KB's"
    ),
    "mtp_accept": _c(
        0.64,
        "x",
        "vLLM + b12x GLM-5.2 MTP, 3 draft steps: acceptance 63.8% (sjug/rtx6kpro "
        "models/glm5.2_v20.md); tokens a step = 1 + steps x acceptance (vLLM's definition)",
    ),
    "dsa_topk": _c(2048, "tokens", "GLM-5 config.json index_topk: each query attends its indexer's top 2,048 tokens"),
    "calibration_context": _c(
        256,
        "tokens",
        "the published tables' '0 context': short prompts; the context at the "
        "middle of a few hundred decoded tokens (an assumption)",
    ),
    "step_fixed": _c(
        float("nan"),
        "s",
        "fitted: per-step fixed cost (graph launch, sampling, scheduler), on SGLang "
        "CUTLASS TP8 c = 1 and 64 once the NCCL latency is set",
    ),
    "nccl_latency": _c(
        float("nan"),
        "s",
        "fitted: NCCL latency a collective, from SGLang + b12x TP8 c = 1 with NCCL "
        "(52.8 tok/s) and with a one-shot all-reduce (56.6): what the one-shot saves a step",
    ),
}
# Fitted on the SGLang CUTLASS TP8 table at c = 1 and 64 (``calibrate``); tests/test_predict.py refits and compares.
FITTED = {"step_fixed": 8.413e-3, "nccl_latency": 16.19e-6}

# Our op on the H200, real routing (top-8 of 256, seed 43), CUDA-graph replay: (B, active experts, us a layer).
# bench/h200/runs/run49_bench_real_h200_seed43.json in the bench record at 00e4ba9.
H200_MOE = {
    "ep8": ((1, 1.0625, 19.76), (2, 2.125, 28.86), (4, 4.1875, 44.21), (8, 6.875, 58.07), (16, 11.3125, 85.47),
            (32, 19.8125, 137.93), (64, 28.0, 195.59), (128, 31.5, 219.8), (256, 32.0, 236.79)),
    "tp8": ((1, 8.0, 17.6), (2, 15.8125, 24.46), (4, 30.75, 38.03), (8, 56.75, 58.92), (16, 102.5625, 96.48),
            (32, 161.6875, 140.61), (64, 223.75, 190.52), (128, 251.625, 220.12), (256, 256.0, 242.8)),
}  # fmt: skip
H200_EXPERT_BYTES = {"ep8": 3 * 6144 * 2048 * NVFP4_BYTES, "tp8": 3 * 6144 * 256 * NVFP4_BYTES}

# Published decode tok/s, 8x RTX PRO 6000 (shared/FACTS.md): SGLang TP8 GLM-5-NVFP4, BF16 KV, 0 context
# (voipmonitor/rtx6kpro models/glm5.md); vLLM + b12x GLM-5.2 TP8 (sjug/rtx6kpro models/glm5.2_v20.md).
SGLANG_CUTLASS = {1: 50.4, 8: 276.9, 16: 427.4, 32: 659.7, 64: 1010.6}
SGLANG_B12X = {1: 51.6, 8: 301.9, 16: 315.2, 32: 451.2, 64: 590.7}
SGLANG_CUTLASS_MTP = {1: 93.7, 8: 392.4, 16: 590.1, 32: 994.5, 64: 1424.6}
ANCHORS = {"vLLM + b12x, c = 1": (87.5, 88.6), "vLLM + b12x MTP3, c = 1": (158.3, 162.9),
           "vLLM + b12x, c = 32": (934, 934), "vLLM + b12x MTP3, c = 32": (1188, 1188)}  # fmt: skip


def value(name: str, fitted: dict[str, float] | None = None) -> float:
    fitted = FITTED if fitted is None else fitted
    return fitted[name] if name in fitted else CONSTANTS[name].value


# ---------------------------------------------------------------------------------------------------------------
# Routing and the MoE layer.


def touched_mean(tokens: float, local_experts: int, experts: int, top_k: int) -> float:
    """Expected distinct local experts a step of ``tokens`` touches (each token: top_k of ``experts``, uniform)."""
    return local_experts * (1 - (1 - top_k / experts) ** tokens)


def touched_max(tokens: float, local_experts: int, experts: int, top_k: int, ranks: int) -> float:
    """Expected largest count of touched local experts over ``ranks`` ranks (each local expert touched alone with the
    mean's probability): the rank a step waits for under expert parallelism."""
    if ranks <= 1:
        return touched_mean(tokens, local_experts, experts, top_k)
    p = 1 - (1 - top_k / experts) ** tokens
    cdf, total = 0.0, 0.0
    for k in range(local_experts):
        cdf += math.comb(local_experts, k) * p**k * (1 - p) ** (local_experts - k)
        total += 1 - min(cdf, 1.0) ** ranks
    return total


def _interp_log(xs: list[float], ys: list[float], x: float) -> float:
    """ys at x, linear in log x between the points, held at the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + f * (y1 - y0)
    raise AssertionError("unreachable")


def h200_sm_time_per_byte(table: str, tokens: float) -> float:
    """Seconds a touched NVFP4 byte takes on the H200 above the op's fixed part, at ``tokens`` per step (B)."""
    rows = H200_MOE[table]
    per_byte = [(us * 1e-6 - value("moe_fixed")) / (active * H200_EXPERT_BYTES[table]) for _, active, us in rows]
    return _interp_log([float(b) for b, _, _ in rows], per_byte, tokens)


def copy_bandwidth(gpu: GpuTarget) -> float:
    return gpu.mem_bandwidth * value("copy_over_datasheet")


def ours_layer_time(gpu: GpuTarget, table: str, tokens: float, touched: float, expert_bytes: float,
                    slots: float = 0.0) -> float:  # fmt: skip
    """Our op's time for one MoE layer on ``gpu``: fixed part + the slowest of the bytes at the target's copy
    bandwidth, the H200's SM time for those bytes scaled by the SM count, and the bf16 MMA work of ``slots`` (token,
    expert) pairs padded to 16-row tiles at the target's BF16 peak (W4A16 dots; binds only where the peak is low)."""
    nbytes = touched * expert_bytes
    memory = nbytes / (value("moe_byte_eff") * copy_bandwidth(gpu))
    sm = h200_sm_time_per_byte(table, tokens) * nbytes * TARGETS["h200"].sm_count / gpu.sm_count
    rows = 16 * math.ceil(max(slots / max(touched, 1e-9), 1) / 16)
    mma = touched * rows * 2 * expert_bytes / NVFP4_BYTES / (value("dense_eff") * gpu.dense_bf16_flops)
    return value("moe_fixed") + max(memory, sm, mma if gpu.dense_bf16_flops else 0.0)


def cutlass_layer_time(gpu: GpuTarget, touched: float, expert_bytes: float, slots: float, expert_flops_row: float,
                       fp4_flops: float) -> float:  # fmt: skip
    """FlashInfer CUTLASS MoE: the touched experts' bytes at CUTLASS's published GEMM efficiency, or the MMA work of
    every touched expert padded to 128-row tiles at the FP4 peak, whichever is longer, plus our op's fixed part."""
    rows = math.ceil(max(slots / max(touched, 1e-9), 1) / value("cutlass_tile_rows")) * value("cutlass_tile_rows")
    memory = touched * expert_bytes / (value("cutlass_byte_eff") * gpu.mem_bandwidth)
    compute = touched * rows * expert_flops_row / (value("dense_eff") * fp4_flops) if fp4_flops else 0.0
    return value("moe_fixed") + max(memory, compute)


def b12x_layer_time(gpu: GpuTarget, touched: float, expert_bytes: float) -> float:
    """b12x: its published layer time split into the bytes of that layer at its published efficiency and the rest (a
    fixed part), then the fixed part plus these bytes at that efficiency."""
    flash_bytes = 8 * 3 * 4096 * 512 * NVFP4_BYTES
    eff_bw = value("b12x_byte_eff") * TARGETS["rtx-pro-6000"].mem_bandwidth
    fixed = value("b12x_layer") - flash_bytes / eff_bw
    return fixed + touched * expert_bytes / (value("b12x_byte_eff") * gpu.mem_bandwidth)


# ---------------------------------------------------------------------------------------------------------------
# The step.


@dataclass(frozen=True)
class Part:
    name: str
    seconds: float


@dataclass(frozen=True)
class Step:
    concurrency: int
    parts: tuple[Part, ...]
    tokens_per_step: float  # per request
    oneshot_saving: float  # seconds a step would save with one-shot all-reduces in place of NCCL's

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def tok_s_user(self) -> float:
        return self.tokens_per_step / self.seconds

    @property
    def tok_s_total(self) -> float:
        return self.concurrency * self.tok_s_user

    def dominant(self) -> Part:
        return max(self.parts, key=lambda p: p.seconds)


@dataclass(frozen=True)
class Options:
    gpu: str = "rtx-pro-6000"
    moe: str = "ours"  # which MoE kernel runs the NVFP4 layers: one of MOE_KERNELS
    context: int = DEFAULT_CONTEXT
    accept: float = 0.64  # MTP: accepted draft tokens / drafted (vLLM's acceptance rate)
    fitted: tuple[tuple[str, float], ...] = tuple(FITTED.items())
    oneshot: bool = False  # the collectives' all-reduces as one-shot PCIe all-reduces


def _dense(gpu: GpuTarget, params: float, tokens: float, peak: float) -> float:
    """BF16 weights read once, or 2 FLOPs a weight a token at ``peak``, whichever is longer."""
    eff = value("dense_eff")
    return max(params * BF16 / (eff * gpu.mem_bandwidth), 2 * params * tokens / (eff * peak))


def _moe_pass(plan: Plan, gpu: GpuTarget, opt: Options, tokens: float) -> float:
    """One forward's routed-MoE layers (the target's NVFP4 experts) on the rank the step waits for."""
    m, lay = plan.model, plan.layout
    local = m.experts // lay.ep
    inter = m.moe_inter // (lay.tp // lay.ep)
    expert_bytes = 3 * m.hidden * inter * NVFP4_BYTES
    touched = touched_max(tokens, local, m.experts, m.top_k, lay.ep)
    slots = tokens * m.top_k * local / m.experts
    if opt.moe == "cutlass":
        t = cutlass_layer_time(gpu, touched, expert_bytes, slots, 2 * 3 * m.hidden * inter, gpu.dense_fp4_flops)
    elif opt.moe == "b12x":
        t = b12x_layer_time(gpu, touched, expert_bytes)
    elif opt.moe == "ours":
        t = ours_layer_time(gpu, "tp8" if lay.ep == 1 else "ep8", tokens, touched, expert_bytes, slots)
    elif opt.moe == "floor":  # no kernel can do better: the touched bytes at the copy bandwidth, nothing fixed
        t = touched * expert_bytes / copy_bandwidth(gpu)
    else:
        raise ValueError(f"moe: expected one of {', '.join(MOE_KERNELS)}, got {opt.moe!r}")
    return m.moe_layers * t


def _weights(m: ModelShape, plan: Plan) -> dict[str, float]:
    """Weights per GPU read by one forward, in parameters, by part (the splits of ``plan.weight_parts``)."""
    lay, h = plan.layout, m.hidden
    attn = attention_weights(m)
    proj = attn.a_proj + (attn.q_b + attn.kv_b + attn.o) / lay.attn_tp  # decode reads w_kc / w_vc, not kv_b too
    return {
        "attention projections": m.layers * proj,
        "indexer": m.layers * attn.indexer,
        "shared expert": m.moe_layers * m.shared_experts * 3 * h * m.moe_inter / shared_expert_split(lay),
        "dense layers": m.dense_layers * 3 * h * m.dense_inter / lay.tp,
        "router": m.moe_layers * m.experts * h,
        "LM head": m.vocab * h / (lay.attn_tp if lay.dp_lm_head else lay.tp),
    }


def _forward(plan: Plan, gpu: GpuTarget, opt: Options, c: int, q: float, layers: int) -> dict[str, float]:
    """One forward of ``layers`` decoder layers over c requests x q tokens: seconds by part (no MoE, no collectives)."""
    m, lay = plan.model, plan.layout
    peak = gpu.dense_bf16_flops
    share = layers / m.layers
    w = _weights(m, plan)
    tokens = c * q
    attn_tokens = math.ceil(c / lay.attn_dp) * q  # under DP attention each group runs its own requests
    head_tokens = attn_tokens if lay.dp_lm_head else tokens
    out = {
        "attention projections": _dense(gpu, w["attention projections"] * share, attn_tokens, peak),
        "shared expert": _dense(gpu, w["shared expert"] * share, tokens, peak),
        "dense layers": _dense(gpu, w["dense layers"] * share, tokens, peak) if layers == m.layers else 0.0,
        "router": _dense(gpu, w["router"] * share, tokens, peak),
        "LM head": _dense(gpu, w["LM head"], head_tokens, peak),
    }
    # KV: a request's q queries attend the DSA top-k tokens each, read once for all of them (the union of their
    # top-k sets: at most the context); the indexer reads every token's key once a request.
    requests = math.ceil(c / lay.attn_dp)
    per_layer = kv_bytes_per_token(m, plan.kv_dtype) / m.layers
    key = m.index_head_dim + m.index_head_dim // 128 * 4 if m.index_head_dim else 0
    seen = min(opt.context, int(value("dsa_topk"))) if m.index_head_dim else opt.context
    union = min(opt.context, q * seen)
    eff = value("dense_eff")
    kv_bytes = layers * requests * (union * (per_layer - key) + opt.context * key)
    kv_flops = layers * attn_tokens * 2 * (m.heads / lay.attn_tp) * seen * (2 * m.kv_lora + m.qk_rope)
    out["attention over KV"] = max(kv_bytes / (eff * gpu.mem_bandwidth), kv_flops / (eff * peak))
    idx_flops = layers * attn_tokens * 2 * m.index_heads * m.index_head_dim * opt.context  # FP8: twice the BF16 peak
    out["indexer"] = max(_dense(gpu, w["indexer"] * share, attn_tokens, peak), idx_flops / (eff * 2 * peak))
    return out


def _collective_time(plan: Plan, c: int, opt: Options, oneshot: bool) -> float:
    m = plan.model
    lat = value("nccl_latency", dict(opt.fitted))
    total = 2 * lat  # the embedding's all-reduce and the logits' gather, once a forward
    for col in collectives(plan):
        size = col.bytes_per_call(m, c)
        factor = (2 if col.kind == "all-reduce" else 1) * (col.gpus - 1) / col.gpus
        one = lat + factor * size / value("nccl_busbw")
        if oneshot and col.kind == "all-reduce":  # one-shot where it is faster (small sizes), NCCL above
            one = min(one, value("oneshot_latency") + size * (col.gpus - 1) / value("oneshot_p2p"))
        total += col.calls * one
    return total


def predict(plan: Plan, concurrency: int, opt: Options | None = None) -> Step:
    """The predicted decode step of ``plan`` at ``concurrency`` running requests."""
    opt = opt or Options()
    if opt.gpu not in TARGETS:
        raise ValueError(f"--gpu {opt.gpu}: expected one of {', '.join(GPUS)}")
    gpu = TARGETS[opt.gpu]
    if not gpu.dense_bf16_flops:
        raise ValueError(f"--gpu {opt.gpu}: hardware.py has no BF16 peak for it; expected one of {', '.join(GPUS)}")
    m, lay, c = plan.model, plan.layout, concurrency
    fitted = dict(opt.fitted)
    d = plan.spec_draft_tokens if lay.draft_layers else 1
    parts = _forward(plan, gpu, opt, c, d, m.layers)
    moe = _moe_pass(plan, gpu, opt, c * d)
    coll = _collective_time(plan, c, opt, opt.oneshot)
    saving = coll - _collective_time(plan, c, opt, True) if not opt.oneshot else 0.0
    named = [
        Part("routed MoE layers", moe),
        *(Part(k, v) for k, v in parts.items()),
        Part("collectives", coll),
        Part("fixed per step", value("step_fixed", fitted)),
    ]
    tokens = 1.0
    if lay.draft_layers:
        tokens = 1 + plan.spec_steps * opt.accept
        named.append(Part("MTP draft", _draft_time(plan, gpu, opt, c)))
    return Step(c, tuple(named), tokens, saving)


def _draft_time(plan: Plan, gpu: GpuTarget, opt: Options, c: int) -> float:
    """The NEXTN draft: ``steps`` passes of one token a request and one extend pass of d tokens, each the MTP layer
    (BF16 experts, read as dense weights), eh_proj, the LM head, its collectives and our op's fixed part a layer."""
    m, lay = plan.model, plan.layout
    inter = m.moe_inter // (lay.tp // lay.ep)
    local = m.experts // lay.ep
    total = 0.0
    for q, passes in ((1, plan.spec_steps), (plan.spec_draft_tokens, 1)):
        parts = _forward(plan, gpu, opt, c, q, lay.draft_layers)
        parts.pop("dense layers")
        tokens = c * q
        touched = touched_max(tokens, local, m.experts, m.top_k, lay.ep)
        rows = tokens * m.top_k * local / m.experts / max(touched, 1e-9)  # tokens a touched expert runs
        experts = value("moe_fixed") + _dense(gpu, touched * 3 * m.hidden * inter, rows, gpu.dense_bf16_flops)
        eh_proj = _dense(gpu, 2 * m.hidden * m.hidden, tokens, gpu.dense_bf16_flops)
        coll = 2 * value("nccl_latency", dict(opt.fitted))  # embedding and logits (the layer's: ``collectives``)
        total += passes * (sum(parts.values()) + lay.draft_layers * experts + eh_proj + coll)
    return total


# ---------------------------------------------------------------------------------------------------------------
# Calibration: two constants, then predictions of what was not fitted.


def published_plan(mtp: bool = False) -> Plan:
    """The published SGLang configuration: GLM-5-NVFP4, 8x RTX PRO 6000, TP8, FlashInfer CUTLASS MoE, BF16 KV."""
    profile = load_profile("rtx-pro-6000x8-tp8")
    if mtp:
        profile = profile.with_mtp()
    model, name = load_model_config()
    return make_plan(profile, model, model_name=name, overrides={"moe-runner-backend": "flashinfer_cutlass"},
                     check=False)  # fmt: skip


def _options(moe: str, fitted: dict[str, float], **kw) -> Options:
    return Options(moe=moe, context=int(value("calibration_context")), fitted=tuple(fitted.items()), **kw)


def fit_constants() -> dict[str, float]:
    """The NCCL latency from the published one-shot gain (SGLang + b12x TP8, c = 1: 52.8 tok/s with NCCL, 56.6 with a
    one-shot all-reduce), then the per-step fixed cost on the CUTLASS table at c = 1 and 64 (log errors equal and
    opposite). The two are paid once a step at every c, so that table alone cannot tell them apart."""
    plan = published_plan()
    gain = 1 / 52.8 - 1 / 56.6  # seconds a step the one-shot all-reduce saved

    def saving(latency: float) -> float:
        return predict(plan, 1, _options("b12x", {"step_fixed": 0.0, "nccl_latency": latency})).oneshot_saving

    lo, hi = 0.0, 1e-3  # the saving grows with the latency: bisect
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if saving(mid) < gain else (lo, mid)
    latency = (lo + hi) / 2
    base = {"step_fixed": 0.0, "nccl_latency": latency}
    b1 = predict(plan, 1, _options("cutlass", base)).seconds
    b64 = predict(plan, 64, _options("cutlass", base)).seconds
    p1, p64 = 1 / SGLANG_CUTLASS[1], 64 / SGLANG_CUTLASS[64]
    # (b1 + F) / p1 = p64 / (b64 + F)
    s = b1 + b64
    fixed = (-s + math.sqrt(s * s - 4 * (b1 * b64 - p1 * p64))) / 2
    return {"step_fixed": fixed, "nccl_latency": latency}


@dataclass(frozen=True)
class Check:
    what: str
    published: float  # tok/s (total)
    predicted: float
    role: str  # "fit" (a point the constants were fitted on), "prediction" (within ``line``) or "indicative"
    line: float = 0.20  # the error it must stay within, for a prediction

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1

    @property
    def ok(self) -> bool:
        return self.role != "prediction" or abs(self.error) <= self.line


def calibration(fitted: dict[str, float] | None = None) -> list[Check]:
    fitted = fit_constants() if fitted is None else fitted
    plan = published_plan()
    rows = []
    for c, tok in SGLANG_CUTLASS.items():
        got = predict(plan, c, _options("cutlass", fitted)).tok_s_total
        rows.append(Check(f"SGLang CUTLASS TP8, c = {c}", tok, got, "fit" if c in (1, 64) else "prediction"))
    b12x_c1 = predict(plan, 1, _options("b12x", fitted))
    rows.append(Check("vLLM + b12x GLM-5.2 TP8, c = 1 (b12x layer time, no refit)", 88.0, b12x_c1.tok_s_total,
                      "prediction"))  # fmt: skip
    for c in (1, 8):
        got = predict(plan, c, _options("b12x", fitted)).tok_s_total
        rows.append(Check(f"SGLang + b12x TP8, c = {c}", SGLANG_B12X[c], got, "prediction"))
    oneshot = predict(plan, 1, _options("b12x", fitted, oneshot=True)).tok_s_total
    rows.append(Check("SGLang + b12x TP8 one-shot all-reduce, c = 1", 56.6, oneshot, "fit"))
    mtp = published_plan(mtp=True)  # its draft steps and acceptance are not published: 3 steps at 0.64
    for c in (1, 32):
        got = predict(mtp, c, _options("cutlass", fitted)).tok_s_total
        rows.append(Check(f"SGLang CUTLASS TP8 MTP, c = {c} (3 steps at 0.64 assumed)", SGLANG_CUTLASS_MTP[c], got,
                          "indicative"))  # fmt: skip
    return rows
