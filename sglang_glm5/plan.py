"""``sglang-glm5 plan``: will GLM-5-NVFP4 fit, and how many tokens of KV cache are left, under a profile.

Per GPU: routed-expert weights in NVFP4 (packed e2m1 + one e4m3 scale per 16 + fp32 per-tensor scales),
everything else in BF16, split the way SGLang 0.5.23's DeepSeek-V2 model code splits it:

- routed experts: 1/tp of them per GPU (E/ep experts, each cut tp/ep ways along the intermediate dim);
- MLA: q_a, kv_a and the DSA indexer are ``ReplicatedLinear`` (every GPU holds them); q_b, kv_b, o_proj
  and the w_kc / w_vc copies made from kv_b after loading are split over the attention-TP group
  (tp / attn-dp GPUs);
- shared experts and the 3 dense MLPs: split over tp (replicated with flashinfer_cutlass when its FP4
  all-gather path is on: DP attention with ep == attn-dp);
- embedding: split over tp, or over the attention-TP group under DP attention; lm_head over tp, or the
  attention-TP group with --enable-dp-lm-head; router and norms replicated.

KV cache per token (MLA + DSA, ``pool_configurator`` in SGLang): per layer (kv_lora_rank + qk_rope_head_dim)
elements of the KV dtype (FP8 e4m3: the latent in FP8 with an fp32 scale per 128, the rope part in BF16),
plus the indexer's FP8 key with its scale (index_head_dim + index_head_dim / 128 * 4 bytes). MLA keeps
one latent per token for all heads, so the cache is not split by tensor parallelism: each attention
data-parallel rank holds the whole cache of its own requests. SGLang gives mem-fraction-static of the
GPU's memory to weights + KV; the rest is for activations and CUDA graphs.

With MTP (``--speculative-algorithm NEXTN``, profile ``[mtp]`` table): the checkpoint's MTP layer
(``num_nextn_predict_layers``) is a draft model of its own, in BF16 (SGLang's NextN model drops the modelopt_fp4
config): a decoder layer (MLA + DSA indexer, 256 BF16 routed experts split like the target's, a shared expert)
plus ``eh_proj`` (an ``nn.Linear`` on every GPU) and norms; the embedding and lm_head are the target's (shared by
``set_embed_and_head`` after loading). Its KV cache per token is one more layer of the target's
(``pool_configurator``: draft KV = target KV x draft layers / target layers, plus the draft's indexer keys).

Communication per decode step is a model of the collectives SGLang 0.5.23 issues per layer (``communicator`` /
``dp_attention``): TP attention all-reduces the attention and the MoE outputs over the whole group; DP attention
reduces the attention output inside its attention-TP group, all-gathers every group's tokens before the MoE and
reduce-scatters the MoE output after it (decode under CUDA graphs: MAX_LEN padding).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path

from sglang_glm5.profiles import DEFAULT_PROFILE, MTP_FLAG, FlagValue, Profile, load_profile

GIB = 1 << 30
BF16 = 2
NVFP4_GROUP = 16  # elements per e4m3 block scale
DSA_QUANT_BLOCK = 128  # FP8 KV / indexer key: one fp32 scale per 128 elements
DEFAULT_MODEL_CONFIG = "glm-5.json"


class PlanError(ValueError):
    """The plan does not fit, or its inputs are inconsistent. The message says by how much."""


@dataclass(frozen=True)
class ModelShape:
    """The config.json fields that decide memory (DeepSeek-V3.2-style MLA + DSA MoE, e.g. GLM-5)."""

    hidden: int
    layers: int
    dense_layers: int  # first_k_dense_replace
    experts: int
    shared_experts: int
    top_k: int
    moe_inter: int
    dense_inter: int
    heads: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int
    index_head_dim: int  # 0: no DSA indexer
    index_heads: int
    vocab: int
    max_context: int
    tie_embeddings: bool
    mtp_layers: int = 0  # num_nextn_predict_layers: the checkpoint's MTP (NextN) layers, the NEXTN draft model

    _KEYS = {
        "hidden": "hidden_size", "layers": "num_hidden_layers", "dense_layers": "first_k_dense_replace",
        "experts": "n_routed_experts", "shared_experts": "n_shared_experts", "top_k": "num_experts_per_tok",
        "moe_inter": "moe_intermediate_size", "dense_inter": "intermediate_size", "heads": "num_attention_heads",
        "q_lora": "q_lora_rank", "kv_lora": "kv_lora_rank", "qk_nope": "qk_nope_head_dim",
        "qk_rope": "qk_rope_head_dim", "v_head": "v_head_dim", "vocab": "vocab_size",
        "max_context": "max_position_embeddings",
    }  # fmt: skip

    @classmethod
    def from_config(cls, config: dict, where: str = "config.json") -> ModelShape:
        if not isinstance(config, dict):
            raise PlanError(f"{where}: expected a JSON object (a model's config.json), got {type(config).__name__}")
        missing = [key for key in cls._KEYS.values() if not _is_int(config.get(key))]
        if missing:
            raise PlanError(f"{where}: not an MLA MoE config (GLM-5 / DeepSeek-V3 style); missing {', '.join(missing)}")
        values = {field: config[key] for field, key in cls._KEYS.items()}
        may_be_zero = {"dense_layers", "shared_experts"}
        bad = [f"{cls._KEYS[f]} = {v}" for f, v in values.items() if v < (0 if f in may_be_zero else 1)]
        if values["dense_layers"] > values["layers"]:
            bad.append(f"first_k_dense_replace = {values['dense_layers']} > num_hidden_layers = {values['layers']}")
        if values["top_k"] > values["experts"]:
            bad.append(f"num_experts_per_tok = {values['top_k']} > n_routed_experts = {values['experts']}")
        if bad:
            raise PlanError(f"{where}: expected positive sizes (first_k_dense_replace and n_shared_experts may be 0), "
                            f"got {'; '.join(bad)}")  # fmt: skip
        dsa = isinstance(config.get("index_topk"), int)
        return cls(
            **values,
            index_head_dim=int(config.get("index_head_dim", 0)) if dsa else 0,
            index_heads=int(config.get("index_n_heads", 0)) if dsa else 0,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            mtp_layers=int(config.get("num_nextn_predict_layers", 0) or 0),
        )

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_model_config(path: str | Path | None = None) -> tuple[ModelShape, str]:
    """The shape from a config.json (a file or a model folder), or GLM-5's shipped one."""
    if path is None:
        text = (files("sglang_glm5.configs") / "models" / DEFAULT_MODEL_CONFIG).read_text()
        return ModelShape.from_config(json.loads(text), "GLM-5"), "GLM-5 (shipped config)"
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise PlanError(f"model config {p} does not exist")
    try:
        config = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"model config {p}: cannot read it as JSON ({e})") from None
    return ModelShape.from_config(config, str(p)), str(p)


@dataclass(frozen=True)
class Layout:
    tp: int
    ep: int
    attn_dp: int
    backend: str  # --moe-runner-backend
    dp_lm_head: bool = False
    draft_layers: int = 0  # MTP layers run as the NEXTN draft model (0: no speculative decoding)

    @property
    def attn_tp(self) -> int:
        return self.tp // self.attn_dp


@dataclass(frozen=True)
class Part:
    name: str
    bytes_per_gpu: int
    split: str  # how it is divided over the GPUs, for the report


def weight_parts(m: ModelShape, lay: Layout) -> list[Part]:
    """Weight bytes per GPU, by part (see the module docstring for the splits)."""
    h, i = m.hidden, m.moe_inter
    attn = attention_weights(m)
    # One routed expert in NVFP4: w13 [2I, H] and w2 [H, I] as packed e2m1 + e4m3 scales per 16.
    expert_packed = (2 * i * h + h * i) // 2 + (2 * i * h + h * i) // NVFP4_GROUP
    experts = m.moe_layers * m.experts * expert_packed // lay.tp
    experts += m.moe_layers * (m.experts // lay.ep * 3 * 4 + m.experts * 3 * 4)  # fp32 scale_2 (local), input scales
    attention = m.layers * (attn.replicated + attn.stored_split // lay.attn_tp) * BF16
    shared_div = shared_expert_split(lay)
    shared = m.moe_layers * m.shared_experts * 3 * h * i * BF16 // shared_div
    dense = m.dense_layers * 3 * h * m.dense_inter * BF16 // lay.tp
    router = m.moe_layers * (m.experts * h * BF16 + m.experts * 4)
    norms = (m.layers * _layer_norms(m) + h) * BF16
    embed_div = lay.attn_tp if lay.attn_dp > 1 else lay.tp
    embed = m.vocab * h * BF16 // embed_div
    head = 0 if m.tie_embeddings else m.vocab * h * BF16 // (lay.attn_tp if lay.dp_lm_head else lay.tp)
    parts = [
        Part("routed experts (NVFP4)", experts, f"{m.experts // lay.ep} of {m.experts} experts x 1/{lay.tp // lay.ep}"),
        Part("attention (MLA + DSA indexer)", attention, f"a-proj and indexer replicated, the rest 1/{lay.attn_tp}"),
        Part("shared experts", shared, "replicated (FP4 all-gather path)" if shared_div == 1 else f"1/{lay.tp}"),
        Part("dense MLP layers", dense, f"1/{lay.tp}"),
        Part("embedding", embed, f"1/{embed_div}"),
        Part("lm_head", head, "tied" if m.tie_embeddings else f"1/{lay.attn_tp if lay.dp_lm_head else lay.tp}"),
        Part("router and norms", router + norms, "replicated"),
    ]
    if lay.draft_layers:
        parts += mtp_parts(m, lay)
    return parts


@dataclass(frozen=True)
class AttentionWeights:
    """One MLA + DSA layer's weights, in parameters."""

    a_proj: int  # q_a, kv_a: replicated on every GPU
    indexer: int  # the DSA indexer's projections: replicated
    q_b: int  # split over the attention-TP group, like the two below
    kv_b: int  # kv_b, stored a second time as the absorbed w_kc / w_vc, which decode reads instead
    o: int

    @property
    def replicated(self) -> int:
        return self.a_proj + self.indexer

    @property
    def stored_split(self) -> int:
        """The split weights a GPU holds: q_b, kv_b and w_kc / w_vc, o."""
        return self.q_b + 2 * self.kv_b + self.o


def attention_weights(m: ModelShape) -> AttentionWeights:
    h = m.hidden
    indexer = m.q_lora * m.index_heads * m.index_head_dim + h * m.index_head_dim + h * m.index_heads
    return AttentionWeights(
        a_proj=h * m.q_lora + h * (m.kv_lora + m.qk_rope),
        indexer=indexer if m.index_head_dim else 0,
        q_b=m.q_lora * m.heads * (m.qk_nope + m.qk_rope),
        kv_b=m.kv_lora * m.heads * (m.qk_nope + m.v_head),
        o=m.heads * m.v_head * h,
    )


def shared_expert_split(lay: Layout) -> int:
    """How many ways the shared expert is split: 1 (replicated) where FlashInfer's CUTLASS backend all-gathers FP4
    activations under DP attention with ep == attn_dp, else the TP size."""
    fp4_allgather = lay.backend == "flashinfer_cutlass" and lay.attn_dp > 1 and lay.ep == lay.attn_dp
    return 1 if fp4_allgather else lay.tp


def _layer_norms(m: ModelShape) -> int:
    return 2 * m.hidden + m.q_lora + m.kv_lora + 2 * m.index_head_dim


def mtp_parts(m: ModelShape, lay: Layout) -> list[Part]:
    """The NEXTN draft model per GPU: the MTP layer(s) in BF16 (see the module docstring)."""
    h, i, n = m.hidden, m.moe_inter, lay.draft_layers
    experts = n * m.experts * 3 * h * i * BF16 // lay.tp
    attn = attention_weights(m)
    attention = attn.replicated + attn.stored_split // lay.attn_tp
    shared = m.shared_experts * 3 * h * i * BF16 // lay.tp
    router = m.experts * h * BF16 + m.experts * 4
    eh_proj = 2 * h * h * BF16  # nn.Linear: every GPU holds it
    norms = (_layer_norms(m) + 3 * h) * BF16  # + enorm, hnorm, shared_head.norm
    rest = n * (attention * BF16 + shared + router + eh_proj + norms)
    return [
        Part("MTP: routed experts (BF16)", experts,
             f"{n} layer, {m.experts // lay.ep} of {m.experts} experts x 1/{lay.tp // lay.ep}"),
        Part("MTP: attention and the rest", rest,
             f"attention as above, shared expert 1/{lay.tp}, eh_proj replicated; embedding, lm_head shared"),
    ]  # fmt: skip


def kv_bytes_per_token(m: ModelShape, kv_dtype: str, draft_layers: int = 0) -> int:
    """KV-cache bytes per token on one attention rank, all layers and the draft's (SGLang 0.5.23's MLA/DSA pools)."""
    latent = m.kv_lora + m.qk_rope
    if kv_dtype in ("auto", "bf16", "bfloat16"):
        per_layer = latent * BF16
    elif kv_dtype == "fp8_e4m3" and m.index_head_dim:
        per_layer = m.kv_lora + m.kv_lora // DSA_QUANT_BLOCK * 4 + m.qk_rope * BF16
    elif kv_dtype in ("fp8_e4m3", "fp8_e5m2"):
        per_layer = latent
    else:
        raise PlanError(f"--kv-cache-dtype {kv_dtype}: the planner knows auto, bfloat16, fp8_e4m3, fp8_e5m2")
    if m.index_head_dim:
        per_layer += m.index_head_dim + m.index_head_dim // DSA_QUANT_BLOCK * 4
    return (m.layers + draft_layers) * per_layer


@dataclass(frozen=True)
class Plan:
    profile: Profile
    model_name: str
    model: ModelShape
    layout: Layout
    context: int
    gpu_memory: int  # bytes per GPU
    mem_fraction: float
    kv_dtype: str
    parts: tuple[Part, ...]
    kv_bytes_per_token: int
    max_running_requests: int
    cuda_graph_max_bs_decode: int
    spec_steps: int = 0  # --speculative-num-steps (0: no speculative decoding)
    spec_draft_tokens: int = 0  # --speculative-num-draft-tokens: tokens per request in a verify pass

    @property
    def weights(self) -> int:
        return sum(p.bytes_per_gpu for p in self.parts)

    @property
    def static_budget(self) -> int:
        return int(self.gpu_memory * self.mem_fraction)

    @property
    def kv_pool(self) -> int:
        return self.static_budget - self.weights

    @property
    def tokens_per_rank(self) -> int:
        return max(self.kv_pool, 0) // self.kv_bytes_per_token

    @property
    def tokens_total(self) -> int:
        return self.tokens_per_rank * self.layout.attn_dp

    @property
    def requests_at_context(self) -> int:
        return self.layout.attn_dp * (self.tokens_per_rank // self.context)

    def values(self) -> dict[str, FlagValue]:
        """The flags whose values come from the plan rather than straight from the profile."""
        return {
            "context-length": self.context,
            "max-running-requests": self.max_running_requests,
            "cuda-graph-max-bs-decode": self.cuda_graph_max_bs_decode,
        }


def _int(profile: Profile, overrides: dict[str, str], name: str, default: int) -> int:
    raw = overrides.get(name, profile.get(name, default))
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise PlanError(f"--{name} {raw}: expected a positive integer") from None
    if value < 1:
        raise PlanError(f"--{name} {raw}: expected a positive integer")
    return value


def make_plan(
    profile: Profile,
    model: ModelShape,
    *,
    model_name: str = "GLM-5",
    context: int | None = None,
    gpu_memory_gib: float | None = None,
    overrides: dict[str, str] | None = None,
    check: bool = True,
) -> Plan:
    """The plan for ``profile`` with SGLang flag values from ``overrides`` (flag name without "--" -> value).

    With ``check`` (the default) raises PlanError when the weights or one request of ``context`` tokens do not fit.
    """
    ov = overrides or {}
    tp = _int(profile, ov, "tp-size", 1)
    ep = _int(profile, ov, "ep-size", 1)
    attn_dp = _int(profile, ov, "attn-dp-size", 1)
    backend = str(ov.get("moe-runner-backend", profile.get("moe-runner-backend", "auto")))
    dp_lm_head = "enable-dp-lm-head" in ov or profile.get("enable-dp-lm-head") is True
    if tp != profile.num_gpus:
        raise PlanError(f"--tp-size {tp} must equal the GPUs of profile {profile.name}: {profile.num_gpus}")
    if ep < 1 or tp % ep or model.experts % ep:
        raise PlanError(f"--ep-size {ep} must divide --tp-size {tp} and the {model.experts} experts")
    if attn_dp < 1 or tp % attn_dp:
        raise PlanError(f"--attn-dp-size {attn_dp} must divide --tp-size {tp}")
    if backend == "flashinfer_cutlass" and ep not in (1, tp):
        raise PlanError(f"--moe-runner-backend flashinfer_cutlass needs --ep-size 1 or {tp} (the tp size), got {ep}")
    ctx = context or _int(profile, ov, "context-length", profile.context)
    if not 1 <= ctx <= model.max_context:
        raise PlanError(f"--context {ctx}: expected 1 to {model.max_context} (the model's max_position_embeddings)")
    try:
        mem_fraction = float(ov.get("mem-fraction-static", profile.get("mem-fraction-static", 0.85)))
    except ValueError:
        raise PlanError(f"--mem-fraction-static {ov['mem-fraction-static']}: expected a number") from None
    if not 0 < mem_fraction < 1:
        raise PlanError(f"--mem-fraction-static {mem_fraction}: expected a fraction between 0 and 1")
    spec = str(ov.get(MTP_FLAG, profile.get(MTP_FLAG, "")) or "").upper()
    draft_layers, steps, draft_tokens = 0, 0, 0
    if spec:
        if spec not in ("NEXTN", "EAGLE"):
            raise PlanError(f"--{MTP_FLAG} {spec}: the planner knows NEXTN (the checkpoint's MTP layer as the draft)")
        if not model.mtp_layers:
            raise PlanError(f"--{MTP_FLAG} {spec}: {model_name} has no MTP layer (num_nextn_predict_layers is 0)")
        draft_layers = model.mtp_layers
        steps = _int(profile, ov, "speculative-num-steps", 3)  # SGLang 0.5.23's default for GLM-5: 3 steps, topk 1
        topk = _int(profile, ov, "speculative-eagle-topk", 1)
        draft_tokens = steps + 1 if topk == 1 else _int(profile, ov, "speculative-num-draft-tokens", 4)
    layout = Layout(tp, ep, attn_dp, backend, dp_lm_head, draft_layers)
    max_running = _int(profile, ov, "max-running-requests", 48 if spec else 256)  # 48: SGLang's default with spec
    graph_bs = min(_int(profile, ov, "cuda-graph-max-bs-decode", 256), math.ceil(max_running / attn_dp))
    kv_dtype = str(ov.get("kv-cache-dtype", profile.get("kv-cache-dtype", "auto")))
    memory = gpu_memory_gib if gpu_memory_gib is not None else profile.gpu_memory_gib
    plan = Plan(
        profile, model_name, model, layout, ctx, int(memory * GIB), mem_fraction, kv_dtype,
        tuple(weight_parts(model, layout)), kv_bytes_per_token(model, kv_dtype, draft_layers), max_running, graph_bs,
        steps, draft_tokens,
    )  # fmt: skip
    if check:
        check_fits(plan)
    return plan


def check_fits(plan: Plan) -> None:
    budget, weights = plan.static_budget, plan.weights
    where = f"{plan.model_name} under {plan.profile.name} on {plan.gpu_memory / GIB:.1f} GiB GPUs"
    if weights > budget:
        raise PlanError(
            f"does not fit: {where} needs {weights / GIB:.1f} GiB of weights per GPU, but --mem-fraction-static "
            f"{plan.mem_fraction} leaves {budget / GIB:.1f} GiB for weights and KV cache: short by "
            f"{(weights - budget) / GIB:.1f} GiB before any KV cache"
        )
    need = plan.context * plan.kv_bytes_per_token
    if plan.kv_pool < need:
        raise PlanError(
            f"does not fit: {where} leaves {plan.kv_pool / GIB:.2f} GiB of KV cache per GPU, less than one "
            f"--context {plan.context} request ({need / GIB:.2f} GiB): short by {(need - plan.kv_pool) / GIB:.2f} GiB"
        )


def attn_dp_table(plan: Plan) -> list[tuple[int, int, int | None]]:
    """(attn-dp, weights per GPU, KV tokens in total or None when it does not fit) for each divisor of tp."""
    rows = []
    for d in (d for d in range(1, plan.layout.tp + 1) if plan.layout.tp % d == 0):
        lay = replace(plan.layout, attn_dp=d)
        weights = sum(p.bytes_per_gpu for p in weight_parts(plan.model, lay))
        pool = plan.static_budget - weights
        tokens = d * (pool // plan.kv_bytes_per_token) if pool >= plan.context * plan.kv_bytes_per_token else None
        rows.append((d, weights, tokens))
    return rows


@dataclass(frozen=True)
class Collective:
    """One kind of collective in a decode step: ``calls`` calls over ``gpus`` GPUs, each moving the hidden states
    (bf16) of ``tokens`` x R tokens, R being the running requests of the whole server."""

    what: str  # which pass: target decode / target verify / draft
    kind: str  # all-reduce | all-gather | reduce-scatter
    gpus: int
    tokens: float  # per request: 1/attn_dp for an attention-group reduce, x draft tokens in a verify pass
    calls: int  # per decode step
    purpose: str

    def bytes_per_call(self, model: ModelShape, requests: int) -> float:
        """The whole tensor (all GPUs' parts together)."""
        return self.tokens * requests * model.hidden * BF16

    def sent_per_gpu(self, model: ModelShape, requests: int) -> float:
        """Bytes one GPU sends, ring algorithm: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n."""
        factor = (2 if self.kind == "all-reduce" else 1) * (self.gpus - 1) / self.gpus
        return factor * self.bytes_per_call(model, requests) * self.calls


SMALL_COLLECTIVE_S = 45e-6  # published: a 4 KB NCCL all-reduce on 8 PCIe RTX 6000-class cards takes ~45 us


def collectives(plan: Plan) -> list[Collective]:
    """The per-layer collectives of one decode step (module docstring); embedding and lm_head left out."""
    lay, m = plan.layout, plan.model
    passes = [("target decode", m.layers, 1.0)]
    if lay.draft_layers:
        d = plan.spec_draft_tokens
        passes = [
            (f"target verify ({d} tokens/request)", m.layers, float(d)),
            (f"draft, {plan.spec_steps} steps", plan.spec_steps * lay.draft_layers, 1.0),
            ("draft extend after verify", lay.draft_layers, float(d)),
        ]
    rows = []
    for what, layers, tokens in passes:
        if lay.attn_dp == 1:
            rows.append(Collective(what, "all-reduce", lay.tp, tokens, layers, "attention output"))
            rows.append(Collective(what, "all-reduce", lay.tp, tokens, layers, "MoE / MLP output"))
            continue
        if lay.attn_tp > 1:
            rows.append(Collective(what, "all-reduce", lay.attn_tp, tokens / lay.attn_dp, layers,
                                   "attention output, inside the attention-TP group"))  # fmt: skip
        rows.append(Collective(what, "all-gather", lay.tp, tokens, layers, "every DP group's tokens, before MoE / MLP"))
        rows.append(Collective(what, "reduce-scatter", lay.tp, tokens, layers, "MoE / MLP output back to the groups"))
    return rows


def format_communication(plan: Plan, requests: tuple[int, ...] = (1, 64)) -> list[str]:
    m, rows = plan.model, collectives(plan)
    lines = [
        f"  communication per decode step, R running requests (model of SGLang 0.5.23's per-layer collectives; "
        f"bf16 hidden states, {m.hidden * BF16:,} B per token; embedding and lm_head add a few per step):",
        f"    {'pass':<33s} {'collective':<15s} {'GPUs':>4s}  {'tokens/call':>11s}  {'calls':>5s}  purpose",
    ]
    for c in rows:
        tokens = "R" if c.tokens == 1 else (f"{c.tokens:g} R" if c.tokens > 1 else f"R/{round(1 / c.tokens)}")
        lines.append(f"    {c.what:<33s} {c.kind:<15s} {c.gpus:>4d}  {tokens:>11s}  {c.calls:>5d}  {c.purpose}")
    calls = sum(c.calls for c in rows)
    sent = ", ".join(f"{sum(c.sent_per_gpu(m, r) for c in rows) / 1e6:.2f} MB at R={r}" for r in requests)
    lines.append(
        f"    total: {calls} collectives per step; sent per GPU: {sent}; at ~{SMALL_COLLECTIVE_S * 1e6:.0f} us per "
        f"small PCIe collective (published) the count alone is ~{calls * SMALL_COLLECTIVE_S * 1e3:.1f} ms per step"
    )
    return lines


def format_plan(plan: Plan) -> str:
    from sglang_glm5.hardware import TARGETS

    lay, gb = plan.layout, 1e9
    changed = [
        f"{what} {now}"
        for what, now, profile_value in [
            ("MoE backend", lay.backend, plan.profile.get("moe-runner-backend", "auto")),
            ("attn-dp", lay.attn_dp, plan.profile.get("attn-dp-size", 1)),
        ]
        if str(now) != str(profile_value)
    ]
    lines = [
        f"plan: {plan.model_name} under {plan.profile.name}: {plan.profile.description}"
        + (f" (overridden after --: {', '.join(changed)})" if changed else ""),
        f"  layout: {plan.profile.num_gpus} GPUs, tp {lay.tp}, ep {lay.ep}, attn-dp {lay.attn_dp} "
        f"(attention TP {lay.attn_tp}), MoE backend {lay.backend}",
        "  weights per GPU:",
    ]
    for p in plan.parts:
        lines.append(f"    {p.name:<30s} {p.bytes_per_gpu / gb:7.2f} GB  {p.split}")
    lines.append(f"    {'total':<30s} {plan.weights / gb:7.2f} GB = {plan.weights / GIB:.2f} GiB")
    target = TARGETS.get(plan.profile.gpu)
    if target and target.mem_bandwidth:
        floor = plan.weights / target.mem_bandwidth * 1e3
        lines.append(f"  decode weight-read floor (every local expert touched): {floor:.1f} ms/step at "
                     f"{target.mem_bandwidth / 1e12:.2f} TB/s ({target.name}, datasheet)")  # fmt: skip
    lines += [
        f"  memory per GPU: {plan.gpu_memory / GIB:.1f} GiB x mem-fraction-static {plan.mem_fraction} = "
        f"{plan.static_budget / GIB:.2f} GiB for weights + KV; {plan.kv_pool / GIB:.2f} GiB of KV cache; "
        f"{(plan.gpu_memory - plan.static_budget) / GIB:.2f} GiB left for activations and CUDA graphs",
        f"  KV cache: {plan.kv_bytes_per_token} bytes per token ({plan.kv_dtype}, MLA latent + DSA indexer key, "
        f"{plan.model.layers} layers" + (f" + {lay.draft_layers} MTP draft layer)" if lay.draft_layers else ")"),
        f"  fits: {plan.tokens_per_rank:,} tokens per attention rank x {lay.attn_dp} = {plan.tokens_total:,} tokens; "
        f"{plan.requests_at_context} requests of the full --context {plan.context}",
        "  attention data parallelism (same tp/ep): attn-dp  weights/GPU  KV tokens in total",
    ]
    for d, weights, tokens in attn_dp_table(plan):
        mark = "  <- this plan" if d == lay.attn_dp else ""
        fits = f"{tokens:,}" if tokens is not None else "does not fit"
        lines.append(f"    {d:>4d}  {weights / gb:7.2f} GB  {fits}{mark}")
    if lay.draft_layers:
        lines.append(f"  MTP: NEXTN draft ({lay.draft_layers} BF16 layer), {plan.spec_steps} draft steps, "
                     f"{plan.spec_draft_tokens} tokens per request in each verify pass")  # fmt: skip
    lines += format_communication(plan)
    return "\n".join(lines)


def format_flags(plan: Plan) -> str:
    derived = plan.values()
    lines = ["  flags:"]
    for flag in plan.profile.flags:
        value = derived.pop(flag.name, flag.value)
        shown = f"--{flag.name}" + ("" if value is True else f" {value}")
        note = "" if value == flag.value else f" (plan: profile said {flag.value})"
        lines.append(f"    {shown:<40s} {flag.reason}{note}")
    for name, value in derived.items():
        lines.append(f"    {f'--{name} {value}':<40s} from --context")
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    from sglang_glm5.cli import positive
    from sglang_glm5.profiles import profile_help

    p = subparsers.add_parser(
        "plan",
        help="weights and KV cache per GPU under a launch profile; refuses a plan that does not fit",
        description="Computes the weights per GPU (NVFP4 routed experts, BF16 rest, split as SGLang splits them), "
        "the MLA + DSA KV-cache bytes per token, how many tokens and full-context requests fit, the collectives of a "
        "decode step, and the SGLang flags that follow. Exit status 2 when the plan does not fit, with the shortfall.",
    )
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=profile_help())
    p.add_argument("--model-config", default=None, help="config.json or a model folder (default: GLM-5's shipped)")
    p.add_argument(
        "--context", type=positive(int), default=None, help="longest request in tokens (default: the profile's)"
    )
    p.add_argument(
        "--gpu-memory-gib", type=positive(float), default=None, help="memory per GPU (default: the profile's GPU)"
    )
    p.add_argument("--mtp", action="store_true", help="with the profile's [mtp] flags: the MTP layer as a NEXTN draft")
    p.set_defaults(func=run)


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The plan `plan`'s options ask for."""
    profile = load_profile(args.profile)
    if args.mtp:
        profile = profile.with_mtp()
    model, name = load_model_config(args.model_config)
    return make_plan(profile, model, model_name=name, context=args.context, gpu_memory_gib=args.gpu_memory_gib)


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    print(format_plan(plan))
    print(format_flags(plan))
    return 0
