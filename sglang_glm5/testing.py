"""Random NVFP4 MoE layers and routings: for the tests, the self-check and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_glm5 import nvfp4


@dataclass(frozen=True)
class MoeLayer:
    w13: torch.Tensor  # [E, 2I, H/2] uint8
    w13_scale: torch.Tensor  # [E, 2I, H/16] e4m3
    w13_scale_2: torch.Tensor  # [E, 2] fp32 (gate, up)
    w2: torch.Tensor  # [E, H, I/2] uint8
    w2_scale: torch.Tensor  # [E, H, I/16] e4m3
    w2_scale_2: torch.Tensor  # [E] fp32

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.w13, self.w13_scale, self.w13_scale_2, self.w2, self.w2_scale, self.w2_scale_2)

    def served(self, *, w4a4: bool = False):
        """A copy of the layer as the SGLang plugin keeps it: an ``Nvfp4MoeWeights`` in the weight layout of
        its device (``Nvfp4MoeWeights.for_device``); these tensors stay in the checkpoint's layout."""
        from sglang_glm5.weights import Nvfp4MoeWeights

        return Nvfp4MoeWeights.build(*self.args()).for_device(w4a4=w4a4)


def _quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qs = [nvfp4.quantize(w[e]) for e in range(w.shape[0])]
    return (
        torch.stack([q.packed for q in qs]),
        torch.stack([q.scale for q in qs]),
        torch.stack([q.global_scale for q in qs]),
    )


def random_layer(
    num_experts: int, hidden: int, inter: int, gen: torch.Generator, device: torch.device | str = "cpu"
) -> MoeLayer:
    """Gaussian weights with a per-row spread of magnitudes, quantized per expert (gate and up apart).

    gen must live on ``device``.
    """

    def weights(*shape):
        spread = 0.5 + torch.rand(*shape[:-1], 1, generator=gen, device=device)
        return torch.randn(*shape, generator=gen, device=device) * spread / shape[-1] ** 0.5

    gate_up = weights(num_experts, 2 * inter, hidden)
    gate = _quantize_experts(gate_up[:, :inter])
    up = _quantize_experts(gate_up[:, inter:])
    w13 = torch.cat([gate[0], up[0]], dim=1)
    s13 = torch.cat([gate[1], up[1]], dim=1)
    g13 = torch.stack([gate[2], up[2]], dim=1)
    w2, s2, g2 = _quantize_experts(weights(num_experts, hidden, inter))
    return MoeLayer(w13, s13, g13, w2, s2, g2)


def random_routing(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    gen: torch.Generator,
    *,
    remote_fraction: float = 0.0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token, weights summing to 2.5 (GLM-5's routed scaling); a fraction of
    slots set to -1 (expert on another rank)."""
    scores = torch.rand(num_tokens, num_experts, generator=gen, device=device)
    ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
    if remote_fraction:
        ids[torch.rand(ids.shape, generator=gen, device=device) < remote_fraction] = -1
    weights = torch.rand(num_tokens, top_k, generator=gen, device=device) + 0.1
    weights = (weights / weights.sum(1, keepdim=True) * 2.5).float()
    return weights, ids
