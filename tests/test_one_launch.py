"""The op in one launch for a few pairs (``variants.w4a16_decode``, ``kernels/nvfp4_moe_decode.py``).

gemm1's split sums, gemm2's wait for its pair's h, and the top-k sum all hang on integer counters that the kernel
must leave zeroed; a wrong count leaves a program waiting forever or reading early. So: the float64 reference at 1,
2 and many active experts with remote (-1) slots and tokens with no local slot, the same bits on a second call (the
counters are left as found), and on a GPU a CUDA graph replayed with other routings.
"""

from __future__ import annotations

import pytest
import torch

from sglang_glm5 import moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.variants import w4a16, w4a16_decode
from sglang_glm5.weights import Nvfp4MoeWeights

EXPERTS, HIDDEN, INTER, TOP_K = 8, 512, 512, 4


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _ids(num_tokens: int, active: int, gen: torch.Generator) -> torch.Tensor:
    """Each token: up to ``active`` distinct local experts among the first ``active``, the other slots -1; token 0 has
    no local slot when there are several tokens."""
    ids = torch.full((num_tokens, TOP_K), -1, dtype=torch.int32)
    for t in range(1 if num_tokens > 1 else 0, num_tokens):
        n = int(torch.randint(1, min(TOP_K, active) + 1, (1,), generator=gen))
        ids[t, torch.randperm(TOP_K, generator=gen)[:n]] = torch.randperm(active, generator=gen)[:n].to(torch.int32)
    return ids


@pytest.fixture
def one_launch(monkeypatch):
    monkeypatch.setattr(w4a16_decode, "MAX_PAIRS", 32)


@pytest.mark.parametrize("layout", ["kernel", "kernel_wgmma"])
@pytest.mark.parametrize("num_tokens, active", [(1, 1), (2, 2), (3, 8), (8, 8)])
def test_one_launch_matches_float64_reference_and_repeats(num_tokens, active, layout, gen, device, one_launch):
    layer = random_layer(EXPERTS, HIDDEN, INTER, gen)
    weights = Nvfp4MoeWeights.build(*(t.to(device) for t in layer.args())).converted(layout)
    topk_weights, _ = random_routing(num_tokens, EXPERTS, TOP_K, gen)
    ids = _ids(num_tokens, active, gen)
    x = torch.randn(num_tokens, HIDDEN, generator=gen).bfloat16()
    assert w4a16_decode.applies(ids.numel(), TOP_K, HIDDEN, INTER, x.dtype)
    kw = {"num_global_experts": 16 * EXPERTS}  # EP16: few pairs expected local, so both GEMMs split K
    p = w4a16_decode.plan(ids.numel(), EXPERTS, 16 * EXPERTS, HIDDEN, INTER, 2 * w4a16.sm_count(None))
    if num_tokens <= 3 and device.type == "cpu":
        assert p.splits1 > 1 and p.splits2 > 1, "the interpreter's 8 SMs: both GEMMs split K"
    out = moe.fused_moe(x.to(device), weights, topk_weights.to(device), ids.to(device), **kw)
    want = nvfp4_fused_moe_reference(x, *layer.args(), topk_weights, ids)
    assert _rel(out, want) < 1e-2
    if num_tokens > 1:
        assert out[0].eq(0).all(), "a token with no local slot sums nothing"
    again = moe.fused_moe(x.to(device), weights, topk_weights.to(device), ids.to(device), **kw)
    assert torch.equal(out, again), "the same bits again: every counter was left zeroed"


def test_one_launch_only_for_a_few_pairs_and_no_config(gen, device, one_launch, monkeypatch):
    assert w4a16_decode.applies(32, 8, 6144, 2048, torch.bfloat16), "GLM-5 EP8 B = 4"
    assert not w4a16_decode.applies(40, 8, 6144, 2048, torch.bfloat16), "B = 5: the four launches"
    assert not w4a16_decode.applies(8, 8, 6144, 2048, torch.float32), "16-bit activations only"
    assert not w4a16_decode.applies(8, 8, 6144 + 128, 2048, torch.bfloat16), "H in whole K steps"
    calls = []
    monkeypatch.setattr(w4a16_decode, "run", lambda *a, **k: calls.append(1) or k["out"])
    layer = Nvfp4MoeWeights.build(*(t.to(device) for t in random_layer(EXPERTS, HIDDEN, INTER, gen).args()))
    topk_weights, ids = random_routing(2, EXPERTS, TOP_K, gen)
    x = torch.randn(2, HIDDEN, generator=gen).bfloat16().to(device)
    moe.fused_moe(x, layer, topk_weights.to(device), ids.to(device))
    assert calls == [1]
    moe.fused_moe(x, layer, topk_weights.to(device), ids.to(device), config=w4a16.heuristic_config(1.0))
    assert calls == [1], "a config names the four-launch kernels"


def test_plan_fills_the_programs_with_whole_k_steps():
    # GLM-5 EP8 B = 1 on 264 programs: gemm1 32 N tiles of 64 x 8 splits of 3 K steps; gemm2 96 tiles x 2 splits
    p = w4a16_decode.plan(8, 32, 256, 6144, 2048, 264)
    assert (p.splits1, p.k1_per_split, p.splits2, p.k2_per_split) == (8, 768, 2, 1024)
    busy = w4a16_decode.plan(32, 256, 256, 6144, 256, 264)  # TP8 B = 4: 32 pairs already fill the programs
    assert busy.splits1 == 2 and busy.splits2 == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_one_launch_graph_replays_with_other_routings(gen, device, one_launch):
    if device.type != "cuda":
        pytest.skip("SGLANG_GLM5_TEST_DEVICE is not a GPU")
    layer = random_layer(EXPERTS, HIDDEN, INTER, gen)
    weights = Nvfp4MoeWeights.build(*(t.cuda() for t in layer.args())).for_device()
    topk_weights, _ = random_routing(4, EXPERTS, TOP_K, gen)
    weights_gpu = topk_weights.cuda()  # no host copy inside the capture
    ids = torch.full((4, TOP_K), -1, dtype=torch.int32, device="cuda")
    x = torch.randn(4, HIDDEN, generator=gen).bfloat16().cuda()
    kw = {"num_global_experts": 16 * EXPERTS}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, weights, weights_gpu, ids, **kw)
    for active in (1, EXPERTS, 2):
        ids.copy_(_ids(4, active, gen).cuda())
        out.fill_(float("nan"))
        graph.replay()
        want = nvfp4_fused_moe_reference(x.cpu(), *layer.args(), topk_weights, ids.cpu())
        assert _rel(out, want) < 1e-2, f"{active} active, from the graph"
        assert torch.equal(out, moe.fused_moe(x, weights, weights_gpu, ids, **kw)), "eagerly, the same bits"
