"""The deployment planner against a hand computation for GLM-5-NVFP4 on 8x RTX PRO 6000 (96 GB). CPU only."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files

import pytest

from sglang_glm5 import plan as P
from sglang_glm5.profiles import load_profile, parse_profile, profile_names

GIB = 2**30
PROFILES = ("rtx-pro-6000x8-ep8", "rtx-pro-6000x8-tp8", "rtx-pro-6000x16-ep16", "h200x8")

# ---------------------------------------------------------------------------------------------------------------
# The hand computation. GLM-5: H 6144, 78 layers (3 dense, 75 MoE), 256 routed experts of I 2048, 1 shared expert,
# dense intermediate 12288, 64 heads, q_lora 2048, kv_lora 512, qk_nope 192, qk_rope 64, v_head 256, DSA indexer
# 32 heads x 128, vocab 154880.
#
# One routed expert in NVFP4: w13 [4096, 6144] + w2 [6144, 2048] = 37,748,736 weights; 1/2 byte each (e2m1) plus
# one e4m3 byte per 16 (scales): 18,874,368 + 2,359,296 = 21,233,664 bytes.
# All routed experts: 75 layers x 256 x 21,233,664 = 407,686,348,800 bytes; EP8 (or TP8): / 8 = 50,960,793,600,
# plus fp32 per-tensor scales (3 per local expert) and input scales (3 per expert, global-sized on every GPU):
# 75 x (32 + 256) x 12 = 259,200 bytes.
EXPERTS_EP8 = 75 * 256 * 21_233_664 // 8 + 75 * (32 + 256) * 12
# Attention per layer, BF16. Replicated on every GPU (SGLang's ReplicatedLinear): q_a 6144x2048 = 12,582,912,
# kv_a 6144x576 = 3,538,944, indexer wq_b 2048x4096 = 8,388,608, wk 6144x128 = 786,432, weights_proj 6144x32 =
# 196,608: 25,493,504 weights. Split over the attention-TP group: q_b 2048x(64x256) = 33,554,432, kv_b
# 512x(64x448) = 14,680,064 and its w_kc/w_vc copy (the same again), o_proj (64x256)x6144 = 100,663,296:
# 163,577,856 weights.
ATTN_REPLICATED, ATTN_SPLIT = 25_493_504, 163_577_856
# Shared experts 75 x 3x6144x2048 = 2,831,155,200 weights; dense MLPs 3 x 3x6144x12288 = 679,477,248; embedding
# and lm_head 154880x6144 = 951,582,720 each; router 75 x 256x6144 = 117,964,800 (+ fp32 bias 75x256x4 bytes);
# norms 78 x (2x6144 + 2048 + 512 + 2x128) + 6144 = 1,184,256 weights. All BF16: 2 bytes each.
SHARED, DENSE, VOCAB, ROUTER, NORMS = 2_831_155_200, 679_477_248, 951_582_720, 117_964_800, 1_184_256


def hand_weights_ep8(attn_dp: int) -> int:
    """Bytes per GPU, tp 8 / ep 8, nvfp4_triton, attention TP = 8 / attn_dp."""
    attn_tp = 8 // attn_dp
    attention = 78 * (ATTN_REPLICATED + ATTN_SPLIT // attn_tp) * 2
    embed = VOCAB * 2 // (attn_tp if attn_dp > 1 else 8)
    rest = SHARED * 2 // 8 + DENSE * 2 // 8 + embed + VOCAB * 2 // 8 + ROUTER * 2 + 75 * 256 * 4 + NORMS * 2
    return EXPERTS_EP8 + attention + rest


# EP8 with TP attention (attn-dp 1): 50.961 + 78 x (25,493,504 + 20,447,232) x 2 = 7.167 + shared 0.708 + dense
# 0.170 + embedding 0.238 + lm_head 0.238 + router/norms 0.238 = 59.72 GB (55.62 GiB). The rounder "~57 GB per
# GPU" of weight-read floor estimates is the same sum with the MLA a-projections and the indexer split 8 ways;
# SGLang replicates them (3.98 GB per GPU).
# The default profile, attn-dp 4 (attention TP 2): attention 78 x (25,493,504 + 81,788,928) x 2 = 16.736 GB,
# embedding 1/2 = 0.952 GB: 70.00 GB (65.20 GiB).
# KV per token, BF16: 78 layers x ((512 + 64) x 2 + indexer 128 + 128/128 x 4) = 78 x 1284 = 100,152 bytes.
# FP8 e4m3: 78 x (512 + 4x4 scales + 64 x 2 rope in BF16 + 132) = 78 x 788 = 61,464 bytes.
KV_BF16, KV_FP8 = 78 * 1284, 78 * 788


@pytest.fixture(scope="module")
def glm5() -> P.ModelShape:
    return P.load_model_config()[0]


def test_weights_per_gpu_match_the_hand_computation(glm5):
    profile = load_profile("rtx-pro-6000x8-ep8")
    for attn_dp, gb in ((1, 59.72), (4, 70.00)):  # TP attention (the "~57 GB" case) and the default profile
        plan = P.make_plan(profile, glm5, overrides={"attn-dp-size": str(attn_dp)})
        hand = hand_weights_ep8(attn_dp)
        assert plan.weights == hand, (attn_dp, plan.weights, hand)
        assert round(plan.weights / 1e9, 2) == gb
    assert {p.name: p.bytes_per_gpu for p in plan.parts}["routed experts (NVFP4)"] == EXPERTS_EP8


def test_kv_cache_and_tokens_match_the_hand_computation(glm5):
    assert P.kv_bytes_per_token(glm5, "bfloat16") == KV_BF16 == 100_152
    assert P.kv_bytes_per_token(glm5, "fp8_e4m3") == KV_FP8 == 61_464
    plan = P.make_plan(load_profile("rtx-pro-6000x8-ep8"), glm5)
    # 95.5 GiB x 0.88 = 84.04 GiB for weights + KV; minus 65.20 GiB of weights: 18.84 GiB of KV per GPU.
    pool = int(95.5 * GIB * 0.88) - hand_weights_ep8(4)
    assert plan.kv_pool == pool
    assert plan.tokens_per_rank == pool // KV_BF16 == 202_039  # tokens per DP group
    assert plan.tokens_total == 4 * plan.tokens_per_rank  # each DP group keeps its own MLA cache: 808k tokens
    assert plan.requests_at_context == 4 * (plan.tokens_per_rank // 32768) == 24
    assert plan.cuda_graph_max_bs_decode == 128  # 512 running requests / 4 groups
    tp8 = P.make_plan(load_profile("rtx-pro-6000x8-tp8"), glm5)
    assert tp8.tokens_total == tp8.tokens_per_rank  # TP attention: the latent cache is replicated, not split
    assert plan.tokens_total > 2.5 * tp8.tokens_total


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_fits_and_explains_its_flags(glm5, name):
    assert set(PROFILES) == set(profile_names())
    profile = load_profile(name)
    plan = P.make_plan(profile, glm5)
    assert plan.tokens_per_rank >= profile.context and plan.layout.tp == profile.num_gpus
    assert all(len(flag.reason) > 20 for flag in profile.flags), "every flag carries a one-line reason"
    assert profile.get("quantization") == "modelopt_fp4" and profile.get("moe-runner-backend") == "nvfp4_triton"
    assert profile.get("disable-shared-experts-fusion") is True


# Refusals: each says by how much.
REFUSALS = [
    # (why, gpu memory GiB, context, overrides, text in the message)
    ("a 48 GB GPU cannot hold 65 GiB of weights", 48, None, {}, "short by 23.0 GiB before any KV cache"),
    ("80 GB (an H100): weights fit, KV left for 95k tokens, not one 200k-token request", 80, 200_000, {}, "short by"),
    ("the full 202,752-token context needs 18.9 GiB of BF16 KV: 0.07 GiB more than the pool", None, 202_752, {},
     "less than one --context 202752 request"),
    ("attn-dp 8 with flashinfer_cutlass also replicates the shared experts: 88.7 GB, 1.46 GiB KV < one 32k request",
     None, None, {"attn-dp-size": "8", "moe-runner-backend": "flashinfer_cutlass"}, "short by 1.59 GiB"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_a_plan_that_does_not_fit_is_refused(glm5, case):
    _, memory, context, overrides, text = case
    with pytest.raises(P.PlanError, match="does not fit") as e:
        P.make_plan(
            load_profile("rtx-pro-6000x8-ep8"), glm5, gpu_memory_gib=memory, context=context, overrides=overrides
        )
    assert text in str(e.value)


def test_fp8_kv_fits_the_full_context(glm5):
    plan = P.make_plan(
        load_profile("rtx-pro-6000x8-ep8"), glm5, context=202_752, overrides={"kv-cache-dtype": "fp8_e4m3"}
    )
    assert plan.tokens_per_rank == plan.kv_pool // KV_FP8 > 202_752


def test_bad_profile_files_are_named():
    with pytest.raises(ValueError, match=r"\[flags\] tp-size must be"):
        parse_profile(
            "x", 'description="d"\ngpu="h200"\ngpu_memory_gib=1\ngpus_per_node=1\ncontext=1\n[flags]\ntp-size=8\n'
        )
    with pytest.raises(ValueError, match="unknown profile 'nope'; expected one of h200x8"):
        load_profile("nope")
    with pytest.raises(P.PlanError, match="missing num_hidden_layers, first_k_dense_replace, n_routed_experts"):
        P.ModelShape.from_config({"hidden_size": 1})
    # valid JSON that is not an object, and sizes that would print negative memory and token counts
    with pytest.raises(P.PlanError, match="expected a JSON object .* got list"):
        P.ModelShape.from_config([])
    glm5 = json.loads((files("sglang_glm5.configs") / "models" / P.DEFAULT_MODEL_CONFIG).read_text())
    with pytest.raises(P.PlanError, match="got num_hidden_layers = -1"):
        P.ModelShape.from_config({**glm5, "num_hidden_layers": -1})
    with pytest.raises(P.PlanError, match="n_routed_experts = 0; num_experts_per_tok = 8 > n_routed_experts = 0"):
        P.ModelShape.from_config({**glm5, "n_routed_experts": 0})
    with pytest.raises(P.PlanError, match="missing num_attention_heads"):
        P.ModelShape.from_config({**glm5, "num_attention_heads": True})
    assert P.ModelShape.from_config({**glm5, "n_shared_experts": 0}).shared_experts == 0


def test_plan_flags_must_be_positive():
    # A negative --max-running-requests once came out as --cuda-graph-max-bs-decode -1 in the printed command.
    glm5 = P.load_model_config()[0]
    for name in ("max-running-requests", "tp-size", "context-length", "cuda-graph-max-bs-decode"):
        with pytest.raises(P.PlanError, match=f"--{name} -5: expected a positive integer"):
            P.make_plan(load_profile("rtx-pro-6000x8-ep8"), glm5, overrides={name: "-5"})
        with pytest.raises(P.PlanError, match=f"--{name} 0: expected a positive integer"):
            P.make_plan(load_profile("rtx-pro-6000x8-ep8"), glm5, overrides={name: "0"})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_glm5.cli", *args], capture_output=True, text=True, timeout=60)


def test_plan_cli(tmp_path):
    out = _cli("plan", "--profile", "rtx-pro-6000x8-ep8")
    assert out.returncode == 0, out.stderr
    assert "total                            70.00 GB = 65.20 GiB" in out.stdout
    assert "--attn-dp-size 4" in out.stdout and "808,156 tokens" in out.stdout
    small = _cli("plan", "--gpu-memory-gib", "48")
    assert small.returncode == 2 and "Traceback" not in small.stderr
    assert small.stderr.strip().count("\n") == 0 and "short by 23.0 GiB" in small.stderr
    (tmp_path / "config.json").write_text('{"hidden_size": 6144}')
    bad = _cli("plan", "--model-config", str(tmp_path))
    assert bad.returncode == 2 and "not an MLA MoE config" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_and_serve_import_nothing_heavy():
    heavy = "{'torch', 'triton', 'sglang'}"
    code = f"import sys, sglang_glm5.plan, sglang_glm5.serve; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_header_names_overrides():
    # The stock baseline of scripts/run_loadtest.sh logs this plan: its header must not claim nvfp4_triton.
    glm5, ep8 = P.load_model_config()[0], load_profile("rtx-pro-6000x8-ep8")
    assert "overridden" not in P.format_plan(P.make_plan(ep8, glm5)).splitlines()[0]
    header = P.format_plan(P.make_plan(ep8, glm5, overrides={"moe-runner-backend": "flashinfer_cutlass"})).splitlines()
    assert header[0].endswith("(overridden after --: MoE backend flashinfer_cutlass)"), header[0]
