"""The dense prefill path: exact bf16 dequantization (interpreter), and the whole path on a GPU."""

from __future__ import annotations

import pytest
import torch

from sglang_glm5 import nvfp4, prefill
from sglang_glm5.moe import nvfp4_fused_moe
from sglang_glm5.reference import nvfp4_fused_moe_reference
from sglang_glm5.testing import random_layer, random_routing
from sglang_glm5.weights import Nvfp4MoeWeights


@pytest.mark.parametrize(
    "rows, k",
    [
        (7, 64),  # fewer rows than a block, K a quarter of a block
        (45, 352),  # odd rows, K past one block with a masked tail
    ],
)
def test_dequantize_bf16_is_exact(rows, k, gen, device):
    x = torch.randn(3, rows, k, generator=gen) * torch.rand(3, rows, 1, generator=gen) * 20
    x[0, 0, :16] = 0.0  # an all-zero block: scale 0
    q = nvfp4.quantize(x, 1.0)
    want = nvfp4.dequantize(q.packed, q.scale, 1.0, torch.float32)
    got = prefill.dequantize_bf16(q.packed.to(device), q.scale.to(device)).cpu()
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.float(), want), "e2m1 * e4m3 has at most 6 significant bits: bf16 must hold it exactly"


@pytest.mark.parametrize("value, want", [("", prefill.DEFAULT_MIN_TOKENS), ("0", 0.0), ("96.5", 96.5)])
def test_min_tokens_env(monkeypatch, value, want):
    monkeypatch.setenv(prefill.ENV_MIN_TOKENS, value)
    assert prefill.min_tokens() == want


@pytest.mark.parametrize("value", ["many", "-1", "nan"])
def test_min_tokens_env_rejects_bad_values(monkeypatch, value):
    monkeypatch.setenv(prefill.ENV_MIN_TOKENS, value)
    with pytest.raises(ValueError, match=prefill.ENV_MIN_TOKENS):
        prefill.min_tokens()


def test_not_available_on_cpu():
    assert not prefill.available(torch.device("cpu"))


@pytest.mark.parametrize(
    "num_tokens, top_k, remote_fraction, w13_order",
    [
        (300, 8, 0.0, "gate_up"),  # about 300 tokens per expert: the path the op takes for prefill
        (77, 4, 0.3, "up_gate"),  # -1 ids and the [up; gate] row order
    ],
)
def test_dense_path_matches_reference(num_tokens, top_k, remote_fraction, w13_order, gen, device, monkeypatch):
    num_experts, hidden, inter = 8, 512, 256
    if device.type != "cuda":  # the interpreter and torch's CPU _grouped_mm: small shapes only
        num_tokens, hidden, inter = min(num_tokens, 40), 128, 64
    layer = random_layer(num_experts, hidden, inter, gen)
    w13, s13, g13, w2, s2, g2 = layer.args()
    if w13_order == "up_gate":
        w13 = torch.cat([w13[:, inter:], w13[:, :inter]], dim=1)
        s13 = torch.cat([s13[:, inter:], s13[:, :inter]], dim=1)
    x = torch.randn(num_tokens, hidden, generator=gen).bfloat16()
    weights, ids = random_routing(num_tokens, num_experts, top_k, gen, remote_fraction=remote_fraction)
    args = (x, w13, s13, g13, w2, s2, g2, weights, ids)
    want = nvfp4_fused_moe_reference(*args, w13_order=w13_order)
    dev_args = [a.to(device) for a in args]
    if device.type == "cuda":
        if not prefill.available(device):
            pytest.skip("needs a GPU with a native torch._grouped_mm (sm_90 / sm_100)")
        monkeypatch.setenv(prefill.ENV_MIN_TOKENS, "0")  # through the public op
        got = nvfp4_fused_moe(*dev_args, w13_order=w13_order)
    else:
        out = torch.empty_like(x)
        bundle = Nvfp4MoeWeights.build(*dev_args[1:7], w13_order=w13_order)
        got = prefill.dense_moe(dev_args[0], bundle, *dev_args[7:], out=out)
    err = (got.cpu().double() - want).norm() / want.norm()
    assert err < 1e-2, f"relative error {err:.2e}"


@pytest.mark.parametrize(
    "path, tokens_per_expert_above, want",
    [
        ("auto", True, "dense"),  # what a server runs: dense prefill from the threshold
        ("auto", False, "w4a16"),
        ("w4a16", True, "w4a16"),  # pins the W4A16 kernels
        ("dense", False, "dense"),  # forced at any size
    ],
)
def test_which_path_a_call_takes_on_a_dense_capable_gpu(path, tokens_per_expert_above, want, gen, device, monkeypatch):
    """The dispatch alone: prefill.available and the interpreter check are faked, the paths replaced."""
    from sglang_glm5 import moe
    from sglang_glm5.variants import w4a16

    taken = []
    monkeypatch.setattr(moe, "interpreting", lambda: False)
    monkeypatch.setattr(prefill, "available", lambda device: True)
    monkeypatch.setenv(prefill.ENV_MIN_TOKENS, "2" if tokens_per_expert_above else "1000")
    monkeypatch.setattr(prefill, "dense_moe", lambda *a, out, **k: taken.append("dense") or out)
    monkeypatch.setattr(w4a16, "run", lambda *a, out, **k: taken.append("w4a16") or out)
    layer = random_layer(4, 64, 32, gen)
    x = torch.randn(8, 64, generator=gen).bfloat16()
    weights, ids = random_routing(8, 4, 2, gen)  # 16 pairs over 4 experts: 4 tokens per expert
    nvfp4_fused_moe(*(t.to(device) for t in (x, *layer.args(), weights, ids)), path=path)
    assert taken == [want]
