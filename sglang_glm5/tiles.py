"""Tile configs of the NVFP4 MoE GEMMs (``GemmConfig``, ``MoeConfig``) and the ahead-of-time compile of
one kernel for a target GPU (``compile_for_target``: no GPU needed; Triton's ``metadata.shared`` is the
shared memory a config takes there).

Each kernel family (``sglang_glm5.variants``) has its own search space, heuristic and shared-memory model
on top of these: shared memory decides whether a config launches at all (SM120 gives a block 101376 B,
Hopper 232448 B), and oversized configs still compile, the limit being checked only at launch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

# K splits a GEMM may use at decode (the last program of a gemm1 tile adds them, unrolled).
MAX_SPLITS = 32
# The most programs per SM a config's split plan may aim for, or its stream-K schedule may run.
MAX_PROGRAMS_PER_SM = 8


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one MoE GEMM kernel."""

    block_m: int  # (token, slot) pairs per program; all share one expert
    block_n: int  # output columns per program (weight rows: the tensor cores' M in the W4A16 kernels)
    block_k: int  # reduction step, in unpacked elements (a multiple of 32)
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 0  # K splits: 0 = as many as the call needs to fill the GPU (variants.w4a16), else this many
    programs_per_sm: int = 0  # with split_k 0: what the call's split plan aims for; 0 = the family's default
    stream: int = 0  # gemm1 of variants.w4a16 only (other kernels ignore it): > 0 = a stream-K schedule, per SM
    # variants.w4a16 only: the Gluon kernel where it runs (variants/w4a16_gluon.py: sm_90), else the Triton one with
    # the same tile and plan
    gluon: bool = False
    # the Gluon gemm1 only: a K step's gate quarters, then up's (one matrix's packed words in registers at a time);
    # the same sums in the same order, so the same bits; the Triton kernels ignore it
    gate_then_up: bool = False
    # the Gluon gemm1 only: its copies issued by a warp group of their own (warp specialization, 4 more warps beside
    # the tile's 4); the same sums in the same order, so the same bits; the Triton kernels ignore it
    producer: bool = False
    # variants.w4a16's Triton gemm2 only: K (I) in one step, several N tiles a program on the block's activations
    # loaded once (``ONE_K_STEP``), its only form; so its shared memory is that form's alone (GLM-5 TP8, I = 256:
    # 128x128x256-w8-s3 takes 233472 B on sm_90 in the forms that loop over K, past the 232448 B limit, and fits
    # in this one). A launch that cannot run it so (I deeper than block_k, or a single N tile) is refused.
    one_k_step: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {v}")
        if self.block_k < 32:
            raise ValueError(f"GemmConfig.block_k must be >= 32 (the W4A16 kernels need >= 64), got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"GemmConfig.num_stages must be in 1..8, got {self.num_stages}")
        if not 0 <= self.split_k <= MAX_SPLITS:
            raise ValueError(f"GemmConfig.split_k must be in 0..{MAX_SPLITS} (0 = chosen per call), got {self.split_k}")
        if not 0 <= self.programs_per_sm <= MAX_PROGRAMS_PER_SM:
            raise ValueError(
                f"GemmConfig.programs_per_sm must be in 0..{MAX_PROGRAMS_PER_SM} (0 = the default), "
                f"got {self.programs_per_sm}"
            )
        if self.split_k and self.programs_per_sm:
            raise ValueError(f"GemmConfig: a fixed split_k ({self.split_k}) leaves no plan for programs_per_sm to aim")
        if not 0 <= self.stream <= MAX_PROGRAMS_PER_SM:
            raise ValueError(
                f"GemmConfig.stream must be in 0..{MAX_PROGRAMS_PER_SM} (0 = no stream-K schedule), got {self.stream}"
            )
        if self.stream and (self.split_k or self.programs_per_sm):
            raise ValueError(f"GemmConfig: a stream-K schedule ({self.stream} per SM) has no split plan, got {self}")
        if self.gluon and not self.gluon_takes:
            raise ValueError(
                "GemmConfig: the Gluon kernels take 16-128 rows, 4 or 8 warps (one or two warp groups: block_n a "
                f"multiple of 16 * num_warps), block_k >= 128, 2 or more stages and no stream-K schedule, got {self}"
            )
        if self.gate_then_up and not self.gluon:
            raise ValueError(f"GemmConfig: gate_then_up orders the Gluon gemm1's wgmmas (needs gluon=True), got {self}")
        if self.producer and not (self.gluon and self.num_warps == 4):
            raise ValueError(
                f"GemmConfig: producer gives the Gluon gemm1 of one warp group (gluon=True, 4 warps) a copying warp "
                f"group, got {self}"
            )
        if self.one_k_step and (self.gluon or self.has_plan):
            raise ValueError(
                f"GemmConfig: one_k_step is a form of the Triton gemm2, which does not split K in it, got {self}"
            )

    @property
    def gluon_takes(self) -> bool:
        """Whether the Gluon kernels (variants/w4a16_gluon.py) can run this tile: up to 128 pairs a block (the wgmma's
        N), one or two warp groups of 64 weight rows (16 a warp) or a multiple, a K step of 128 or more (whole
        16-word scale groups), a ring of 2+ stages, no stream-K schedule."""
        rows = self.block_n % (16 * self.num_warps) == 0
        return (not self.stream and self.block_m <= 128 and self.num_warps in (4, 8) and rows and self.block_k >= 128
                and self.num_stages >= 2)  # fmt: skip

    @property
    def has_plan(self) -> bool:
        """Whether the config fixes its grid (a split count, a split target or a stream-K schedule) rather than
        leaving it to the call's plan."""
        return bool(self.split_k or self.programs_per_sm or self.stream)

    def without_plan(self) -> GemmConfig:
        """The same tile with the grid left to the call's plan."""
        return dataclasses.replace(self, split_k=0, programs_per_sm=0, stream=0)

    @property
    def label(self) -> str:
        split = f"-k{self.split_k}" if self.split_k else f"-p{self.programs_per_sm}" if self.programs_per_sm else ""
        if self.stream:
            split = f"-sk{self.stream}"
        form = "".join(mark for mark, on in (("-gl", self.gluon), ("-gu", self.gate_then_up), ("-ws", self.producer),
                                             ("-1k", self.one_k_step)) if on)  # fmt: skip
        return f"{self.block_m}x{self.block_n}x{self.block_k}-w{self.num_warps}-s{self.num_stages}{split}{form}"

    @classmethod
    def from_label(cls, label: str) -> GemmConfig:
        """The config of ``label`` ("16x128x256-w4-s3", with "-k2", "-p1" or "-sk2" for a fixed split, plan or stream-K
        schedule, then "-gl" for the Gluon kernels, "-gu" for gemm1's gate-then-up order, "-ws" for its producer warp
        group and "-1k" for gemm2's one K step)."""
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)-w(\d+)-s(\d+)(?:-k(\d+)|-p(\d+)|-sk(\d+))?(-gl)?(-gu)?(-ws)?(-1k)?", label)
        if m is None:
            raise ValueError(
                f"config label: expected like 16x128x256-w4-s3[-k2|-p1|-sk2][-gl][-gu][-ws][-1k], got {label!r}"
            )
        *sizes, gluon, gate_then_up, producer, one_k_step = m.groups()
        block_m, block_n, block_k, warps, stages, split_k, per_sm, stream = (int(v) if v else 0 for v in sizes)
        return cls(block_m, block_n, block_k, warps, stages, split_k=split_k, programs_per_sm=per_sm, stream=stream,
                   gluon=bool(gluon), gate_then_up=bool(gate_then_up), producer=bool(producer),
                   one_k_step=bool(one_k_step))  # fmt: skip

    def as_dict(self) -> dict[str, int]:
        d = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "block_k": self.block_k,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }
        if self.split_k:
            d["split_k"] = self.split_k
        if self.programs_per_sm:
            d["programs_per_sm"] = self.programs_per_sm
        if self.stream:
            d["stream"] = self.stream
        if self.gluon:
            d["gluon"] = True
        if self.gate_then_up:
            d["gate_then_up"] = True
        if self.producer:
            d["producer"] = True
        if self.one_k_step:
            d["one_k_step"] = True
        return d


def k_splits_cover(k_size: int, block_k: int, splits: int, k_per_split: int) -> bool:
    """Whether ``splits`` of ``k_per_split`` columns (whole K steps of ``block_k``) cover K = ``k_size``, none empty."""
    return k_per_split % block_k == 0 and 0 <= (splits - 1) * k_per_split < k_size <= splits * k_per_split


@dataclass(frozen=True)
class MoeConfig:
    """One config per GEMM; each GEMM sorts the pairs into blocks of its own block_m."""

    gemm1: GemmConfig
    gemm2: GemmConfig


def compile_for_target(fn, consts: dict, cfg: GemmConfig, arch: int, pointers: dict, not_divisible: set):
    """Triton's ahead-of-time compile of one kernel for ``sm_{arch}`` (no GPU needed).

    ``pointers`` maps pointer arguments to Triton types (the rest are i32); every argument outside
    ``not_divisible`` is declared a multiple of 16, as it is in a real launch on these shapes.
    """
    import triton
    from triton.backends.compiler import GPUTarget as TritonTarget

    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(fn.arg_names)
        if sig[a] != "constexpr" and a not in not_divisible
    }
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(src, target=TritonTarget("cuda", arch, 32), options=options)
