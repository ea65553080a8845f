"""Per-GPU MoE layer shapes of GLM-5 (256 routed experts, top-8, hidden 6144, expert I 2048)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    num_experts: int  # E, local experts on one GPU
    hidden: int  # H
    inter: int  # I, intermediate size of one expert on one GPU
    top_k: int = 8
    global_experts: int = 0  # experts over all GPUs (expert parallelism); 0 = num_experts (all local)

    @property
    def all_experts(self) -> int:
        return self.global_experts or self.num_experts

    @property
    def weight_bytes(self) -> int:
        """NVFP4 bytes of all local experts: packed e2m1 plus one e4m3 scale per 16 elements."""
        elements = self.num_experts * 3 * self.hidden * self.inter
        return elements // 2 + elements // 16

    def tokens_at(self, tokens_per_expert: float) -> int:
        """Tokens per step (at least one) that put ``tokens_per_expert`` slots on an expert on average: the
        step the tuner times for a bucket (GLM-5 EP8 and TP8: bucket 1/32 is B = 1, bucket 1/2 is B = 16)."""
        return max(1, round(tokens_per_expert * self.all_experts / self.top_k))

    def __str__(self) -> str:
        return f"E={self.num_experts},H={self.hidden},I={self.inter},k={self.top_k}"


SHAPES = {
    "glm5-ep8": MoeShape(num_experts=32, hidden=6144, inter=2048, global_experts=256),  # 8-way expert parallel
    "glm5-tp8": MoeShape(num_experts=256, hidden=6144, inter=256),  # 8-way tensor parallel
    "glm5-mini": MoeShape(num_experts=8, hidden=256, inter=128),  # GLM-5-like, small enough for the interpreter
}


def parse_shape(text: str) -> MoeShape:
    """A name from SHAPES, or 'E,H,I' (top-k 8, or E where E < 8: a token routes to distinct experts)."""
    if text in SHAPES:
        return SHAPES[text]
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"shape: expected one of {', '.join(SHAPES)} or 'E,H,I' (three integers), got {text!r}")
    e, h, i = (int(p) for p in parts)
    if h < 32 or i < 32 or h % 32 or i % 32 or e < 1:
        raise ValueError(f"shape: H and I must be positive multiples of 32 and E >= 1, got E={e}, H={h}, I={i}")
    return MoeShape(e, h, i, top_k=min(8, e))
