"""The kernel families the op runs, one record each: what the tuner, the cache, ``tune``, ``selfcheck`` and
``bench`` need to know of a family, so that each of those is written once, over a record.

- ``w4a16``: NVFP4 weights decoded in registers, 16-bit activations (any SM80+ GPU);
- ``w4a4``: activations quantized to NVFP4, block-scaled FP4 tensor cores (SM12x only, prefill);
- ``dense``: dense prefill on Hopper (weights dequantized once to bf16, torch grouped GEMMs): no tiles.

A new family is one module here that defines ``VARIANT``, plus its kernels. ``get(name)`` imports the
module when it is first asked for, so that reading the registry costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from sglang_glm5.env import AUTO, PATHS
from sglang_glm5.hardware import GpuTarget
from sglang_glm5.tiles import GemmConfig, MoeConfig

NAMES = tuple(p for p in PATHS if p != AUTO)  # the kernel families, each a module here
Bucket = int | Fraction
# How a family's ``compiled_shared_bytes`` verdict starts, instead of a size, for a tile that compiles and may fit but
# whose compiled decode would compute wrong values (W4A16: a register's two words from two scale blocks,
# ``w4a16_pairs``): the tuner prunes it under its own count, not as a misfit.
DECODE_REFUSED = "decode: "


class DecodeRefused(RuntimeError):
    """Raised by a family's launch when a compiled kernel's decode would compute wrong values (its message starts with
    ``DECODE_REFUSED``): the tuner counts such a candidate with the decode's refusals."""


def resolve(ref: str) -> Callable:
    """'module:function' -> the function (imported now: such fields name code that needs torch or a GPU)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class KernelVariant:
    """One family of MoE kernels. Tiles are ``GemmConfig`` per GEMM kernel; a family without tiles has
    ``kernels == ()`` and no search space."""

    name: str  # the op's path= and the CLI's --path
    title: str  # for messages: "W4A16", "W4A4", "dense prefill"
    requires: str  # the GPUs it runs on, for messages: "an SM80+ GPU"
    runs_on: Callable[[int], bool]  # arch (major * 10 + minor) -> whether it runs there
    kernels: tuple[str, ...] = ()  # GEMM kernels with tile configs
    revision: int = 0  # in every cache key of its tiles: raised when a kernel change makes tuned tiles stale
    key_prefix: str = ""  # of the kernel field of its cache keys ("" for W4A16, "w4a4_" for W4A4)
    tune_buckets: tuple[Bucket, ...] = ()  # tokens per expert `tune` picks tiles for by default
    decode_buckets: bool = False  # whether buckets below one token per expert make sense (split-K decode)
    heuristic: Callable[[float], MoeConfig] | None = None  # tokens per expert -> tiles, feasible everywhere
    search_space: Callable[[Bucket], list[GemmConfig]] | None = None
    model_shared_bytes: Callable[[str, GemmConfig, GpuTarget], int] | None = None  # upper bound, for pruning
    shared_floor: Callable[[str, GemmConfig], int] | None = None  # lower bound: above it the compiler decides
    compiled_shared_bytes: Callable[[list[tuple[str, GemmConfig]], GpuTarget], list[int | str]] | None = None
    # (cfg, kernel, its GEMM's (E, N, K)) -> ValueError when the kernels cannot run it there
    check_config: Callable[..., None] = lambda cfg, kernel=None, enk=None: None
    # (kernel, cfg, shape, bucket, SMs[, targets][, arch=]) -> the same tile with other K split plans (and other
    # kernels' forms that run on sm_{arch}), for the tuner to time
    split_candidates: Callable[..., list[GemmConfig]] | None = None
    step_split_targets: tuple[int, ...] = ()  # the split targets ``tune --splits-only`` tries at a decode step
    # (kernel, tile, layer shape, bucket) -> programs an SM the family's launch sizes that GEMM's grid for, which a
    # tile picked without timing should hold resident by shared memory (0: no aim)
    resident_aim: Callable[..., int] | None = None
    kernel_bencher: str = ""  # "module:function" (shape, seed) -> tuner.Bench, on the local GPU
    after_tune: str = ""  # "module:function" run by `tune` after the tiles are stored (W4A4: its threshold)
    selfcheck: str = ""  # "module:function" (argparse args) -> exit code, for `selfcheck --path NAME`

    def key_kernel(self, kernel: str) -> str:
        """The kernel field of a cache key: the family's prefix, the kernel and the revision ("gemm1.r4")."""
        if kernel not in self.kernels:
            raise ValueError(f"kernel: {self.title} has {self.kernels}, got {kernel!r}")
        return f"{self.key_prefix}{kernel}.r{self.revision}"

    def fits(self, kernel: str, cfg: GemmConfig, target: GpuTarget) -> int | None:
        """Shared bytes when ``cfg`` fits the target by the model and then by the compiler, else None."""
        if not target.fits(self.model_shared_bytes(kernel, cfg, target)):
            return None
        return self.compiled_fit(kernel, cfg, target)

    def compiled_fit(self, kernel: str, cfg: GemmConfig, target: GpuTarget) -> int | None:
        """Shared bytes when the compiler says ``cfg`` fits the target, else None: for a tile already chosen (a
        lookup's, or a form of a timed tile), where the model, an upper bound that only prunes searches, could rule
        out a tile the compiler fits (W4A16 gemm1 64x128x256-w8-s3 on sm_90: 290816 B by the model, 172032
        compiled; the h200 cache's pick at 64 tokens per expert)."""
        (shared,) = self.compiled_shared_bytes([(kernel, cfg)], target)
        return shared if isinstance(shared, int) and target.fits(shared) else None


def get(name: str) -> KernelVariant:
    """The record of a family by name (``NAMES``)."""
    if name not in NAMES:
        raise ValueError(f"path: expected one of {', '.join(NAMES)}, got {name!r}")
    return importlib.import_module(f"sglang_glm5.variants.{name}").VARIANT
