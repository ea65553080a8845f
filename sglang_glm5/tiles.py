"""Tile configs of the NVFP4 MoE kernels and the safe default heuristic."""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("gemm1", "gemm2")


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one MoE GEMM kernel."""

    block_m: int  # (token, slot) pairs per program; all share one expert
    block_n: int  # output columns per program
    block_k: int  # reduction step, in unpacked elements (a multiple of 32)
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {v}")
        if self.block_k < 32:
            raise ValueError(f"GemmConfig.block_k must be >= 32 (two half-width dots of >= 16), got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"GemmConfig.num_stages must be in 1..8, got {self.num_stages}")

    def as_dict(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "block_k": self.block_k,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


@dataclass(frozen=True)
class MoeConfig:
    """One config per GEMM; each GEMM sorts the pairs into blocks of its own block_m."""

    gemm1: GemmConfig
    gemm2: GemmConfig


def heuristic_config(tokens_per_expert: float) -> MoeConfig:
    """A config that is correct everywhere and small enough for any target's shared memory.

    Picked from a sweep of 27-80 configs per size on one H200 (bench/h200_sweep.json): block_k 64
    and 3-4 stages won at every m; block_m follows the tokens per expert. Every config here fits
    SM120's 101376 B: compiled ahead of time for sm_120 (Triton 3.8), the largest, 128 x 64 x 64 at
    3 stages, takes 57600 B in gemm1.
    """
    if tokens_per_expert <= 16:
        cfg = GemmConfig(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=4)
    elif tokens_per_expert <= 32:
        cfg = GemmConfig(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=4)
    elif tokens_per_expert <= 128:
        cfg = GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4)
    else:
        cfg = GemmConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=3)
    return MoeConfig(gemm1=cfg, gemm2=cfg)
