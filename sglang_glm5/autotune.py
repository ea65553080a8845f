"""The tile-config cache and the tuner.

Cache key: owner, kernel, GEMM shape (E, N, K), bucket of tokens per expert (a power of two, or at most one
half a decode step, a multiple of 1/32, where one was tuned: ``step_of``). Value:
the config, its shared memory on the target, its measured time in ms (or ``measured: false`` when
chosen offline), the Triton version.

The owner is whom an entry speaks for (``owner``). A measured entry is a time taken on one kind of GPU:
"NAME|sm_XY", the target's short name and arch (``h200|sm_90``). An unmeasured entry is a config the
shared-memory model and Triton's ahead-of-time compile for sm_XY found feasible, a fact about the
architecture and the shared memory per block: "sm_XY|shared=BYTES" (``sm_120|shared=101376``), read by
every GPU that has both (an RTX PRO 6000 Workstation, Server or Max-Q, an RTX 5090). A lookup prefers
the target's measured entry to its architecture's unmeasured one. Unmeasured entries stored under
"NAME|sm_XY" by earlier versions are still read by that target.

Files: every ``*.json`` in the user's folder ($SGLANG_GLM5_CACHE_DIR/autotune, default
~/.cache/sglang_glm5/autotune), then every one shipped in ``sglang_glm5.configs/autotune``
(``importlib.resources``, so an installed wheel finds them); in each folder the target's own file
(``NAME.json``) first, then the rest by name. Entries are picked by key, never by file name: earlier
files win for the same key, the user's over the shipped ones. Then the family's heuristic. A file
that cannot be read, or an entry of this target that is malformed, no longer fits the target's shared
memory or breaks a rule of its family's kernels (``KernelVariant.check_config``), is reported once and
skipped: a cache never stops a server. Writes are locked and atomic, so 8 ranks may tune at once.

Tuning happens offline (``sglang-glm5 tune``), never inside a request.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from pathlib import Path

from sglang_glm5 import variants
from sglang_glm5._files import cache_dir, read_json, update_json
from sglang_glm5.hardware import GpuTarget
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import KernelVariant

log = logging.getLogger("sglang_glm5.autotune")
MAX_BUCKET = 4096
# Tiles per (kernel, bucket) the tuner times again with other K split plans (``KernelVariant.split_candidates``).
SPLIT_LEADERS = 3
# ``tune --splits-only`` keeps another split plan than the default only when it is at least this much faster: on the
# H200 a plan the tuner timed 0.7% faster than the default measured 2% slower in the whole op (bench/README.md, run 23).
SPLIT_MARGIN = 0.02


# Decode under expert parallelism has fewer tokens than experts: GLM-5 at B tokens per step has
# B * 8 / 256 tokens per expert, so B = 1 .. 16 tokens per step are the buckets 1/32 .. 1/2.
MIN_BUCKET = Fraction(1, 32)
Bucket = int | Fraction


def m_bucket(tokens_per_expert: float) -> int:
    """The smallest power of two >= tokens per expert, within [1, MAX_BUCKET]."""
    b = 1
    while b < tokens_per_expert and b < MAX_BUCKET:
        b *= 2
    return b


def bucket_of(tokens_per_expert: float) -> Bucket:
    """``m_bucket``, extended below 1 to the powers of two down to MIN_BUCKET (a Fraction): the W4A16
    cache keeps decode picks for fewer tokens than experts apart, where few experts are active."""
    if tokens_per_expert > Fraction(1, 2):
        return m_bucket(tokens_per_expert)
    b = Fraction(1, 2)
    while b / 2 >= tokens_per_expert and b > MIN_BUCKET:
        b /= 2
    return b


def step_of(tokens_per_expert: float) -> Fraction | None:
    """The decode step of a call with at most half a token per expert: tokens per expert rounded up to a multiple of
    MIN_BUCKET (GLM-5 under EP8 or TP8: B / 32, each B = 1 .. 16 tokens per step its own); None above one half.
    A step has its own cache entries only where ``tune`` was asked for it (``--batch-sizes 3/32``): the split that
    pays depends on the step's own blocks, and one tuned at an octave bucket's top step lost lower in the bucket
    (bench/README.md, run 22). Without one, a lookup reads the octave bucket (``bucket_of``)."""
    if tokens_per_expert > Fraction(1, 2):
        return None
    steps = max(1, math.ceil(Fraction(tokens_per_expert) / MIN_BUCKET))
    return steps * MIN_BUCKET


def parse_bucket(text: str) -> Bucket:
    """'16' -> 16, '1/32' -> Fraction(1, 32): the ``m=`` field of a cache key, or a --batch-sizes value."""
    value = Fraction(text.strip())
    if value <= 0:
        raise ValueError(f"expected a positive number of tokens per expert, got {text!r}")
    return int(value) if value.denominator == 1 else value


def tune_buckets(tokens_per_expert: Iterable[float]) -> list[Bucket]:
    """The buckets to tune for these tokens per expert: ``step_of`` each at most one half, else ``bucket_of``;
    deduplicated, ascending. Lookups read those keys only, so an entry stored under m=100 would never be read."""
    return sorted({step_of(m) or bucket_of(m) for m in tokens_per_expert})


def gemm_shape(kernel: str, shape: MoeShape) -> tuple[int, int, int]:
    """(E, N, K) of one GEMM of the layer: gemm1 [2I x H], gemm2 [H x I]."""
    if kernel == "gemm1":
        return shape.num_experts, 2 * shape.inter, shape.hidden
    return shape.num_experts, shape.hidden, shape.inter


# A config tuned for m tokens per expert serves untuned buckets up to this many powers of two away:
# tile choice changes slowly with m (bench/h200/tune.log), and an entry measured near m beats a guess.
NEAREST_OCTAVES = 2


def owner(target: GpuTarget, *, measured: bool) -> str:
    """The first two fields of an entry's key (module docstring): "NAME|sm_XY" for a measured entry,
    "sm_XY|shared=BYTES" for an unmeasured one."""
    if measured:
        return f"{target.name}|sm_{target.arch}"
    return f"sm_{target.arch}|shared={target.shared_per_block}"


def owners(target: GpuTarget) -> tuple[str, str]:
    """The owners whose entries a target reads, preferred first: its own measured ones, then its architecture's."""
    return owner(target, measured=True), owner(target, measured=False)


def cache_key(
    target: GpuTarget, kernel: str, enk: tuple[int, int, int], bucket: Bucket, *, measured: bool,
    variant: KernelVariant | None = None,
) -> str:  # fmt: skip
    """The entry's key for a GEMM of a kernel family (default W4A16); the family's revision in it retires
    entries tuned for an earlier kernel design."""
    e, n, k = enk
    field = (variant or variants.get("w4a16")).key_kernel(kernel)
    return f"{owner(target, measured=measured)}|{field}|E={e},N={n},K={k}|m={bucket}"


@dataclass(frozen=True)
class Entry:
    config: GemmConfig
    shared_bytes: int
    ms: float | None  # None: chosen offline, not measured
    triton: str

    def as_json(self) -> dict:
        return {
            "config": self.config.as_dict(),
            "shared_bytes": self.shared_bytes,
            "measured": self.ms is not None,
            "ms": self.ms,
            "triton": self.triton,
        }


def shipped_dir() -> Path:
    """The caches shipped with the package (found through importlib.resources: works in a wheel install)."""
    return Path(str(resources.files("sglang_glm5.configs").joinpath("autotune")))


def user_dir() -> Path:
    return cache_dir() / "autotune"


def shipped_cache_path(target: GpuTarget) -> Path:
    return shipped_dir() / f"{target.name}.json"


def user_cache_path(target: GpuTarget) -> Path:
    """Where ``sglang-glm5 tune`` writes by default."""
    return user_dir() / f"{target.name}.json"


def cache_files(target: GpuTarget) -> list[Path]:
    """The files a target reads, earlier ones winning (module docstring): the user's folder, then the
    shipped one; in each the target's own file first, then the others by name."""
    files = []
    for folder in (user_dir(), shipped_dir()):
        own = folder / f"{target.name}.json"
        others = sorted(p for p in folder.glob("*.json") if p != own) if folder.is_dir() else []
        files += [own, *others]
    return files


_reported: set[str] = set()


def report_once(message: str) -> None:
    """Log a cache problem as a warning, once per process (until ``clear_reports``)."""
    if message not in _reported:
        _reported.add(message)
        log.warning(message)


def clear_reports() -> None:
    """Forget which problems were reported, so that the next lookup reports them again (tests)."""
    _reported.clear()


def _unfit_reason(entry: Entry, target: GpuTarget) -> str | None:
    """Why the target could not launch this entry's config (its shared memory); None when it can. The
    kernels' own rules are the family's (``KernelVariant.check_config``), checked when a lookup reads it."""
    if not target.fits(entry.shared_bytes):
        return f"{entry.shared_bytes} B of shared memory exceeds {target.name}'s {target.shared_per_block} B"
    return None


def _parse_entry(key: str, raw: object, target: GpuTarget, path: Path) -> Entry | None:
    try:
        entry = Entry(GemmConfig(**raw["config"]), int(raw["shared_bytes"]), raw.get("ms"), str(raw["triton"]))
    except (TypeError, KeyError, ValueError) as e:
        report_once(f"{path}: skipping malformed entry {key!r} ({type(e).__name__}: {e})")
        return None
    unfit = _unfit_reason(entry, target)
    if unfit is not None:
        report_once(f"{path}: skipping {key!r}: {unfit}")
        return None
    return entry


def read_cache_file(path: Path) -> dict | None:
    """A cache file's object; None when it is missing, or unreadable (reported once)."""
    try:
        return read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        report_once(f"autotune cache {path} skipped: {e}")
        return None


def _load_entries(path: Path, target: GpuTarget) -> dict[str, Entry]:
    """The file's entries owned by the target (``owners``), checked; other GPUs' entries are left alone."""
    data = read_cache_file(path)
    if data is None:
        return {}
    raw = data.get("entries", {})
    if not isinstance(raw, dict):
        report_once(f"autotune cache {path} skipped: 'entries' is not an object")
        return {}
    mine = tuple(o + "|" for o in owners(target))
    out = {}
    for key, value in raw.items():
        if not key.startswith(mine):
            continue
        entry = _parse_entry(key, value, target, path)
        if entry is not None:
            out[key] = entry
    return out


class ConfigCache:
    """Entries for one target, from the user's files over the shipped ones (``cache_files``); memoized lookups.

    A bucket without an entry of its own borrows the entry of the nearest tuned bucket at most
    ``NEAREST_OCTAVES`` (2) powers of two away, the larger on a tie (``_nearest``); beyond that the
    heuristic. At each bucket the target's measured entry comes before its architecture's unmeasured one.
    (Before the r2 kernels borrowing measured slower than the heuristic on H200, m=32 taking
    1.64 ms with the m=16 tiles against 1.17 ms, and the lookup took exact buckets only; see NEAREST_OCTAVES.)
    Each kernel family (``variants``) reads its own entries, by the kernel field of their keys.
    """

    def __init__(self, target: GpuTarget, paths: Iterable[Path] | None = None):
        self.target = target
        self.paths = list(paths) if paths is not None else cache_files(target)
        self.entries: dict[str, Entry] = {}
        for path in reversed(self.paths):  # earlier paths win
            self.entries.update(_load_entries(path, target))
        self._memo: dict[tuple, MoeConfig] = {}

    def lookup(self, shape: MoeShape, tokens_per_expert: float, path: str = "w4a16") -> MoeConfig:
        """The tiles of a kernel family (``variants.get(path)``) for a call: per GEMM the entry of the call's
        decode step (``step_of``) where one was tuned; else the bucket's entry; else the entry of the nearest
        tuned bucket at most ``NEAREST_OCTAVES`` powers of two away (ties go to the larger); else the family's
        heuristic. An entry the family's kernels cannot run (``check_config``) is reported once and passed over."""
        bucket, step = bucket_of(tokens_per_expert), step_of(tokens_per_expert)
        memo_key = (path, shape.num_experts, shape.hidden, shape.inter, bucket, step)
        cfg = self._memo.get(memo_key)
        if cfg is None:
            variant = variants.get(path)
            fallback = variant.heuristic(tokens_per_expert)
            found = [
                (self._exact(variant, k, gemm_shape(k, shape), step) if step not in (None, bucket) else None)
                or self._nearest(variant, k, gemm_shape(k, shape), bucket)
                for k in variant.kernels
            ]
            cfg = MoeConfig(
                gemm1=found[0].config if found[0] else fallback.gemm1,
                gemm2=found[1].config if found[1] else fallback.gemm2,
            )
            self._memo[memo_key] = cfg
        return cfg

    def _nearest(self, variant: KernelVariant, kernel: str, enk: tuple[int, int, int], bucket: Bucket) -> Entry | None:
        near = [bucket]
        for step in range(1, NEAREST_OCTAVES + 1):
            near += [bucket * 2**step] + ([Fraction(bucket, 2**step)] if bucket / 2**step >= MIN_BUCKET else [])
        for b in (int(b) if b >= 1 else b for b in near):
            entry = self._exact(variant, kernel, enk, b)
            if entry is None:
                continue
            if b != bucket and entry.config.has_plan:
                # A split or stream-K choice was timed at its own bucket's step (splits measured not to carry over
                # to other steps: bench/README.md, run 22): another bucket borrows the tile, the grid is the plan's.
                return dataclasses.replace(entry, config=entry.config.without_plan())
            return entry
        return None

    def _exact(self, variant: KernelVariant, kernel: str, enk: tuple[int, int, int], bucket: Bucket) -> Entry | None:
        """The entry stored under this very bucket (measured first) that the family's kernels can run."""
        for measured in (True, False):
            key = cache_key(self.target, kernel, enk, bucket, measured=measured, variant=variant)
            entry = self.entries.get(key)
            if entry is None:
                continue
            try:
                variant.check_config(entry.config, kernel, enk)
            except ValueError as e:
                report_once(f"autotune cache: skipping {key!r}: {e}")
                continue
            return entry
        return None


_device_caches: dict[int, ConfigCache] = {}


def pick_config(path: str, tokens_per_expert: float, num_experts: int, hidden: int, inter: int, device) -> MoeConfig:
    """The tiles of kernel family ``path`` for a call on ``device`` (a torch.device): this GPU's cache
    (``ConfigCache.lookup``), else the family's heuristic; the heuristic off CUDA (the interpreter).

    One ``ConfigCache`` per GPU serves every family; it is read once per process (``forget_device_caches``
    reads the files again) and memoizes its answers, so a call costs a dict lookup.
    """
    if device.type != "cuda":
        return variants.get(path).heuristic(tokens_per_expert)
    import torch

    from sglang_glm5.hardware import detect

    index = device.index if device.index is not None else torch.cuda.current_device()
    cache = _device_caches.get(index)
    if cache is None:
        cache = _device_caches[index] = ConfigCache(detect(index))
    return cache.lookup(MoeShape(num_experts, hidden, inter), tokens_per_expert, path)


def tiles_in_use(target: GpuTarget, shape: MoeShape, path: str = "w4a16") -> Callable[[str, Bucket], GemmConfig]:
    """(kernel, bucket) -> the tile a call of that many tokens per expert gets from the target's cache files now
    (``ConfigCache.lookup``), with the plan's own K split: what ``tune --splits-only`` chooses a split for."""
    cache = ConfigCache(target)

    def tile(kernel: str, bucket: Bucket) -> GemmConfig:
        return getattr(cache.lookup(shape, bucket, path), kernel).without_plan()

    return tile


def forget_device_caches() -> None:
    """Make the next ``pick_config`` read the cache files again (after a tune stored new entries; tests)."""
    _device_caches.clear()


def store(path: Path, target: GpuTarget, items: dict[str, Entry]) -> None:
    """Merge entries into a cache file (locked, atomic)."""
    import torch
    import triton

    def update(data: dict) -> None:
        data["_metadata"] = {
            "target": target.name,
            "arch": target.arch,
            "device_name": target.device_name,
            "shared_per_block": target.shared_per_block,
            "triton": triton.__version__,
            "torch": torch.__version__,
        }
        entries = data.get("entries") if isinstance(data.get("entries"), dict) else {}
        entries.update({k: v.as_json() for k, v in items.items()})
        data["entries"] = entries

    update_json(path, update)


# ---------------------------------------------------------------------------------------------
# The tuner.


@dataclass
class TuneReport:
    """Counts per (kernel, bucket) pruned or benchmarked, and per GEMM kernel each distinct candidate's
    verdict over all buckets: its shared bytes when it fits the target, else "model" or "compiler"."""

    candidates: int = 0
    pruned_by_model: int = 0
    pruned_by_compiler: int = 0
    benchmarked: int = 0
    split_trials: int = 0  # of the benchmarked: tiles timed again with other split plans
    bench_seconds: float = 0.0
    verdicts: dict[str, dict[GemmConfig, int | str]] = field(default_factory=dict)

    def verdicts_for(self, kernel: str) -> dict[GemmConfig, int | str]:
        return self.verdicts.setdefault(kernel, {})

    def add(self, other: TuneReport) -> None:
        """Add another report's counts and verdicts to this one."""
        counts = ("candidates", "pruned_by_model", "pruned_by_compiler", "benchmarked", "split_trials", "bench_seconds")
        for name in counts:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kernel, verdicts in other.verdicts.items():
            self.verdicts_for(kernel).update(verdicts)

    def space_lines(self, target: GpuTarget, prefix: str = "") -> list[str]:
        """One line per GEMM: its distinct candidates, how many the shared-memory model and the compiler
        ruled out for the target, and the largest tile that fits (by block_m * block_n * block_k, then stages)."""
        lines = []
        for kernel, verdicts in self.verdicts.items():
            fit = {cfg: shared for cfg, shared in verdicts.items() if isinstance(shared, int)}
            by_model = sum(v == "model" for v in verdicts.values())
            by_compiler = sum(v == "compiler" for v in verdicts.values())
            line = (
                f"{prefix}{kernel}: {len(verdicts)} candidates, {by_model} ruled out by the shared-memory model "
                f"and {by_compiler} by the compiler for {target.name} ({target.sm}, {target.shared_per_block} B "
                f"per block), {len(fit)} fit"
            )
            if fit:
                c = max(fit, key=lambda c: (c.block_m * c.block_n * c.block_k, c.num_stages, fit[c], c.label))
                line += f"; largest feasible tile {c.label} ({fit[c]} B)"
            lines.append(line)
        return lines

    @property
    def pruned(self) -> int:
        return self.pruned_by_model + self.pruned_by_compiler

    def summary(self) -> str:
        per = self.bench_seconds / self.benchmarked if self.benchmarked else 0.0
        saved = f", about {self.pruned * per:.0f} s of benchmarking saved" if self.benchmarked else ""
        splits = f" ({self.split_trials} of them split-plan trials)" if self.split_trials else ""
        return (
            f"{self.candidates} candidates, {self.pruned} pruned as infeasible ({self.pruned_by_model} by the model, "
            f"{self.pruned_by_compiler} by the compiler), {self.benchmarked} benchmarked{splits}{saved}"
        )


Bench = Callable[[str, GemmConfig, Bucket], float]  # (kernel, config, bucket) -> median ms


def prune(
    configs: Iterable[GemmConfig],
    target: GpuTarget,
    report: TuneReport,
    model_bytes: Callable[[GemmConfig], int],
    compiled_bytes: Callable[[list[GemmConfig]], list[int | str]] | None,
    floor_bytes: Callable[[GemmConfig], int] | None = None,
    verdicts: dict[GemmConfig, int | str] | None = None,
) -> list[tuple[GemmConfig, int]]:
    """The configs that fit the target's shared memory, with their bytes: the model first (instant),
    then, when ``compiled_bytes`` is given, the AOT compile (an error string counts as not fitting).

    ``model_bytes`` is an upper bound. With the compiler at hand and a lower bound ``floor_bytes``, the
    model discards only what cannot fit even at the floor, and the compiler rules on the rest.
    ``verdicts`` (``TuneReport.verdicts_for``) receives each config's bytes, or what ruled it out."""
    verdicts = {} if verdicts is None else verdicts
    fits_model = []
    for cfg in configs:
        report.candidates += 1
        bound = floor_bytes if (compiled_bytes is not None and floor_bytes is not None) else model_bytes
        if target.fits(bound(cfg)):
            fits_model.append(cfg)
        else:
            report.pruned_by_model += 1
            verdicts[cfg] = "model"
    if compiled_bytes is None:
        out = [(cfg, model_bytes(cfg)) for cfg in fits_model]
    else:
        out = []
        for cfg, shared in zip(fits_model, compiled_bytes(fits_model), strict=True):
            if isinstance(shared, int) and target.fits(shared):
                out.append((cfg, shared))
            else:
                report.pruned_by_compiler += 1
                verdicts[cfg] = "compiler"
    verdicts.update(out)
    return out


def feasible_candidates(
    kernel: str, bucket: Bucket, target: GpuTarget, report: TuneReport, compile_check: bool = True,
    *, variant: KernelVariant | None = None,
) -> list[tuple[GemmConfig, int]]:  # fmt: skip
    """A family's (default W4A16) candidates that fit the target, with their shared bytes (compiled, else
    modelled)."""
    v = variant or variants.get("w4a16")
    return prune(
        v.search_space(bucket), target, report, lambda cfg: v.model_shared_bytes(kernel, cfg, target),
        (lambda configs: v.compiled_shared_bytes([(kernel, c) for c in configs], target)) if compile_check else None,
        (lambda cfg: v.shared_floor(kernel, cfg)) if v.shared_floor else None, report.verdicts_for(kernel),
    )  # fmt: skip


def tune(
    target: GpuTarget,
    shape: MoeShape,
    buckets: Iterable[Bucket],
    bench: Bench | None,
    *,
    variant: KernelVariant | None = None,
    progress: Callable[[str], None] | None = None,
    survey: bool = False,
    tiles: Callable[[str, Bucket], GemmConfig] | None = None,
) -> tuple[dict[str, Entry], TuneReport]:
    """Pick a config per (kernel, bucket) of a kernel family (default W4A16) for one layer shape.

    With ``bench`` (the target is the local GPU) every feasible candidate is timed and the fastest kept; where
    the family has ``split_candidates`` (W4A16 below one token per expert), the SPLIT_LEADERS fastest tiles are
    timed again with other targets for their K split plan. A candidate that fails to compile or launch is
    skipped and counted with the compiler's prunes. Without ``bench``: the heuristic's pick when it fits, else
    the fitting candidate nearest to it, marked unmeasured (one or two AOT compiles, not the whole space); with
    ``survey`` the whole search space is also pruned for the target (AOT compiles, memoized), so that the report
    tells how many candidates the target's shared memory rules out. ValueError when the family does not run on
    the target.

    With ``tiles`` ((kernel, bucket) -> a tile; needs ``bench``) only the K split plan is chosen: that tile is timed
    with its default plan, with each other split count the family's ``step_split_targets`` give the bucket's step and
    with the family's other plans for it (W4A16 gemm1: the stream-K schedule; above the decode buckets also its other
    forms there: the Gluon gemm1's, gemm2's one-K-step tiles), and the fastest is kept if it beats the default plan by
    SPLIT_MARGIN. A (kernel, bucket) gets no entry where no other split count exists and no other plan
    beats the default. This is the cheap tuning of decode steps (``tune --splits-only``): 3-8 timings a GEMM and
    step where a full search takes about 20.
    """
    import triton

    if tiles is not None and bench is None:
        raise ValueError("tune: choosing split plans (tiles=...) needs the target's GPU to time them")

    v = variant or variants.get("w4a16")
    if not v.runs_on(target.arch):
        raise ValueError(f"{v.title} runs only on {v.requires}, got {target.name} ({target.sm})")
    report = TuneReport()
    results: dict[str, Entry] = {}
    say = progress or (lambda _msg: None)
    for kernel, bucket in itertools.product(v.kernels, buckets):
        key = cache_key(target, kernel, gemm_shape(kernel, shape), bucket, measured=bench is not None, variant=v)
        if bench is None:
            if survey:
                feasible_candidates(kernel, bucket, target, report, variant=v)
            want = getattr(v.heuristic(bucket), kernel)
            chosen = None
            for cfg in sorted({want, *v.search_space(bucket)}, key=lambda c: (_distance(c, want), c.label)):
                shared = v.fits(kernel, cfg, target)
                if shared is not None:
                    chosen = (cfg, shared)
                    break
            if chosen is None:
                raise RuntimeError(f"no {v.title} config of {kernel} fits {target.name} ({target.shared_per_block} B)")
            results[key] = Entry(chosen[0], chosen[1], None, triton.__version__)
            say(f"{key}: {chosen[0].label} ({chosen[1]} B, not measured)")
            continue
        if tiles is not None:
            entry = _tune_split(v, kernel, bucket, tiles(kernel, bucket), shape, target, bench, report, say, key)
            if entry is not None:
                results[key] = entry
            continue
        feasible = feasible_candidates(kernel, bucket, target, report, variant=v)
        if not feasible:
            raise RuntimeError(
                f"no {v.title} config of {kernel} fits {target.name} ({target.shared_per_block} B) at m={bucket}"
            )
        timed: list[tuple[float, GemmConfig, int]] = []
        failure = _time_candidates(bench, kernel, bucket, feasible, timed, report, say, f"{key}: ")
        if v.split_candidates is not None:
            # The fastest few tiles again with other split plans (same tile: same shared memory), and the family's
            # other forms there (compiled on their own: _with_shared).
            leaders = sorted(timed, key=lambda t: t[0])[:SPLIT_LEADERS]
            sms, arch = target.sm_count, target.arch
            found = [(c, cfg, shared) for _, cfg, shared in leaders
                     for c in v.split_candidates(kernel, cfg, shape, bucket, sms, arch=arch)]  # fmt: skip
            splits = _with_shared(v, kernel, target, found)
            failure = _time_split_trials(bench, kernel, bucket, splits, timed, report, say, key) or failure
        if not timed:
            raise RuntimeError(f"no {v.title} config of {kernel} ran on this GPU at m={bucket}; last error {failure}")
        ms, cfg, shared = min(timed, key=lambda t: t[0])
        results[key] = Entry(cfg, shared, ms, triton.__version__)
    return results, report


def _tune_split(
    v: KernelVariant, kernel: str, bucket: Bucket, tile: GemmConfig, shape: MoeShape, target: GpuTarget, bench: Bench,
    report: TuneReport, say: Callable[[str], None], key: str,
) -> Entry | None:  # fmt: skip
    """``tune(tiles=...)`` for one (kernel, bucket): the fastest split plan of ``tile``, or None without a choice."""
    import triton

    shared = v.compiled_fit(kernel, tile, target)
    if shared is None:
        raise RuntimeError(f"{key}: {tile.label} does not fit {target.name} ({target.shared_per_block} B)")
    trials = v.split_candidates(kernel, tile, shape, bucket, target.sm_count, v.step_split_targets,
                                arch=target.arch) if v.split_candidates and v.step_split_targets else []  # fmt: skip
    if not trials:
        say(f"{key}: {tile.label}: the plan has no other split count here (no entry)")
        return None
    report.candidates += 1 + len(trials)
    timed: list[tuple[float, GemmConfig, int]] = []
    failure = _time_candidates(bench, kernel, bucket, [(tile, shared)], timed, report, say, f"{key}: ")
    default = timed[0] if timed else None  # the tile with the plan's own split, if it ran
    failure = _time_split_trials(bench, kernel, bucket, _with_shared(v, kernel, target, [(c, tile, shared) for c in
                                 trials]), timed, report, say, key) or failure  # fmt: skip
    if not timed:
        raise RuntimeError(f"{key}: {tile.label} did not run with any split plan; last error {failure}")
    ms, cfg, shared = min(timed, key=lambda t: t[0])  # a trial's own shared bytes (another tile's may differ)
    if default and ms > default[0] * (1 - SPLIT_MARGIN):
        if not any(c.split_k or c.programs_per_sm for c in trials):  # only other schedules tried, none better
            say(f"{key}: {tile.label}: no other plan beats the default here (no entry)")
            return None
        ms, cfg, shared = default  # within the timing spread: the plan's own split stays
    return Entry(cfg, shared, ms, triton.__version__)


def _with_shared(
    v: KernelVariant, kernel: str, target: GpuTarget, trials: list[tuple[GemmConfig, GemmConfig, int]]
) -> list[tuple[GemmConfig, int]]:
    """(trial, its shared bytes) for each (trial, the tile it came from, that tile's shared bytes), once each: a trial
    of the same tile takes its shared memory; another (one of the Gluon gemm1's tiles, or the tile in Gluon) is
    compiled on its own, and dropped if it does not fit."""
    out: dict[GemmConfig, int] = {}
    fits: dict[GemmConfig, int | None] = {}  # per tile: a plan changes no shared memory
    for trial, tile, shared in trials:
        bare = trial.without_plan()
        if bare == tile.without_plan():
            fits[bare] = shared
        elif bare not in fits:
            fits[bare] = v.compiled_fit(kernel, bare, target)
        if trial not in out and fits[bare] is not None:
            out[trial] = fits[bare]
    return list(out.items())


def _time_split_trials(
    bench: Bench, kernel: str, bucket: Bucket, trials: list[tuple[GemmConfig, int]],
    timed: list[tuple[float, GemmConfig, int]], report: TuneReport, say: Callable[[str], None], key: str,
) -> str:  # fmt: skip
    """``_time_candidates`` for tiles with other split plans, counted in ``report.split_trials``."""
    before = report.benchmarked
    failure = _time_candidates(bench, kernel, bucket, trials, timed, report, say, f"{key}: split ")
    report.split_trials += report.benchmarked - before
    return failure


def _time_candidates(
    bench: Bench, kernel: str, bucket: Bucket, candidates: list[tuple[GemmConfig, int]],
    timed: list[tuple[float, GemmConfig, int]], report: TuneReport, say: Callable[[str], None], prefix: str,
) -> str:  # fmt: skip
    """Time each (config, shared bytes) into ``timed`` as (ms, config, shared), progress lines starting with
    ``prefix``; the last failure, or ''."""
    failure = ""
    for i, (cfg, shared) in enumerate(candidates):
        t0 = time.perf_counter()
        try:
            ms = bench(kernel, cfg, bucket)
        except Exception as e:  # noqa: BLE001 - a launch failure (resources, compiler) skips the candidate
            lines = str(e).strip().splitlines()
            failure = f"{cfg.label}: {type(e).__name__}: {lines[-1] if lines else ''}"
            report.pruned_by_compiler += 1
            say(f"{prefix}[{i + 1}/{len(candidates)}] {failure[:200]} (skipped)")
            continue
        report.bench_seconds += time.perf_counter() - t0
        report.benchmarked += 1
        timed.append((ms, cfg, shared))
        best = min(timed, key=lambda t: t[0])
        say(f"{prefix}[{i + 1}/{len(candidates)}] {cfg.label} {ms:.4f} ms (best {best[0]:.4f} ms, {best[1].label})")
    return failure


def _distance(a: GemmConfig, b: GemmConfig) -> tuple:
    """Order candidates by closeness to a wanted config (exact match first)."""
    return (
        abs(a.block_m.bit_length() - b.block_m.bit_length()),
        abs(a.block_n.bit_length() - b.block_n.bit_length()),
        abs(a.block_k.bit_length() - b.block_k.bit_length()),
        abs(a.num_stages - b.num_stages),
        abs(a.num_warps - b.num_warps),
    )


def print_progress(message: str) -> None:
    """One status line, rewritten in place on a terminal (core dependencies exclude tqdm/rich)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + message[:160])
    else:
        sys.stderr.write(message + "\n")
    sys.stderr.flush()
