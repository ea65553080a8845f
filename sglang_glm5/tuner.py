"""The tuner, over a kernel family's record (``variants.KernelVariant``): for each GEMM kernel and bucket of tokens
per expert, the family's candidates that fit the target's shared memory (pruned by the family's model, then by
Triton's ahead-of-time compile: no GPU needed), timed by a bencher, the fastest kept as a cache entry
(``autotune.Entry`` under ``autotune.cache_key``; the caller stores them, ``autotune.store``). Without a bencher (a GPU
not at hand): the heuristic's tile, or the fitting one nearest to it, with fewer stages where it would hold fewer
programs an SM by shared memory than the family's launch sizes that GEMM's grid for (``KernelVariant.resident_aim``),
marked unmeasured.

Tuning happens offline (``sglang-glm5 tune``), never inside a request.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sglang_glm5 import variants
from sglang_glm5.autotune import Bucket, Entry, cache_key, gemm_shape
from sglang_glm5.hardware import GpuTarget
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import KernelVariant

# Tiles per (kernel, bucket) the tuner times again with other K split plans (``KernelVariant.split_candidates``).
SPLIT_LEADERS = 3
# ``tune --splits-only`` keeps another split plan than the default only when it is at least this much faster: on the
# H200 a plan the tuner timed 0.7% faster than the default measured 2% slower in the whole op.
SPLIT_MARGIN = 0.02


@dataclass
class TuneReport:
    """Counts per (kernel, bucket) pruned or benchmarked, and per GEMM kernel each distinct candidate's
    verdict over all buckets: its shared bytes when it fits the target, else "model" or "compiler" (by shared memory,
    or a compile or launch failure) or "decode" (it compiles, but its decode would compute wrong values there:
    ``variants.DECODE_REFUSED``)."""

    candidates: int = 0
    pruned_by_model: int = 0
    pruned_by_compiler: int = 0
    pruned_by_decode: int = 0
    benchmarked: int = 0
    split_trials: int = 0  # of the benchmarked: tiles timed again with other split plans
    bench_seconds: float = 0.0
    verdicts: dict[str, dict[GemmConfig, int | str]] = field(default_factory=dict)

    def verdicts_for(self, kernel: str) -> dict[GemmConfig, int | str]:
        return self.verdicts.setdefault(kernel, {})

    def add(self, other: TuneReport) -> None:
        """Add another report's counts and verdicts to this one."""
        counts = ("candidates", "pruned_by_model", "pruned_by_compiler", "pruned_by_decode", "benchmarked",
                  "split_trials", "bench_seconds")  # fmt: skip
        for name in counts:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kernel, verdicts in other.verdicts.items():
            self.verdicts_for(kernel).update(verdicts)

    def space_lines(self, target: GpuTarget, prefix: str = "") -> list[str]:
        """One line per GEMM: its distinct candidates, how many the shared-memory model and the compiler ruled out for
        the target (and how many the decode check refused, where any), and the largest tile that fits (by block_m *
        block_n * block_k, then stages)."""
        lines = []
        for kernel, verdicts in self.verdicts.items():
            fit = {cfg: shared for cfg, shared in verdicts.items() if isinstance(shared, int)}
            by_model = sum(v == "model" for v in verdicts.values())
            by_compiler = sum(v == "compiler" for v in verdicts.values())
            by_decode = sum(v == "decode" for v in verdicts.values())
            line = (
                f"{prefix}{kernel}: {len(verdicts)} candidates, {by_model} ruled out by the shared-memory model "
                f"and {by_compiler} by the compiler for {target.name} ({target.sm}, {target.shared_per_block} B "
                f"per block), {len(fit)} fit"
            )
            if by_decode:
                line += f", {by_decode} refused for a decode that would pair two scale blocks"
            if fit:
                c = max(fit, key=lambda c: (c.block_m * c.block_n * c.block_k, c.num_stages, fit[c], c.label))
                line += f"; largest feasible tile {c.label} ({fit[c]} B)"
            lines.append(line)
        return lines

    @property
    def pruned(self) -> int:
        return self.pruned_by_model + self.pruned_by_compiler + self.pruned_by_decode

    def summary(self) -> str:
        per = self.bench_seconds / self.benchmarked if self.benchmarked else 0.0
        saved = f", about {self.pruned * per:.0f} s of benchmarking saved" if self.benchmarked else ""
        splits = f" ({self.split_trials} of them split-plan trials)" if self.split_trials else ""
        decode = f", {self.pruned_by_decode} for their decode" if self.pruned_by_decode else ""
        return (
            f"{self.candidates} candidates, {self.pruned} pruned as infeasible ({self.pruned_by_model} by the model, "
            f"{self.pruned_by_compiler} by the compiler{decode}), {self.benchmarked} benchmarked{splits}{saved}"
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
    then, when ``compiled_bytes`` is given, the AOT compile (an error string counts as not fitting; one starting with
    ``variants.DECODE_REFUSED`` is counted as the decode's).

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
            elif isinstance(shared, str) and shared.startswith(variants.DECODE_REFUSED):
                report.pruned_by_decode += 1
                verdicts[cfg] = "decode"
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
    the fitting candidate nearest to it, with fewer stages where it would hold fewer programs resident an SM than the
    family's ``resident_aim`` (``_offline_pick``), marked unmeasured (a few AOT compiles, not the whole space); with
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
            cfg, shared = _offline_pick(v, kernel, bucket, target, shape)
            results[key] = Entry(cfg, shared, None, triton.__version__)
            resident = target.programs_by_shared(shared)
            say(f"{key}: {cfg.label} ({shared} B, {resident} programs an SM by shared memory, not measured)")
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


def _offline_pick(
    v: KernelVariant, kernel: str, bucket: Bucket, target: GpuTarget, shape: MoeShape
) -> tuple[GemmConfig, int]:
    """(config, shared bytes) for a target whose GPU is not at hand: the heuristic's tile where it fits, else the
    fitting candidate nearest to it; where that holds fewer programs an SM by shared memory than the family's
    ``resident_aim`` for the GEMM, the most stages (down to 2) that hold more, up to the aim. On an RTX PRO 6000 the
    3-stage 16x64x256 gemm1 takes 53248 B, one program an SM where a split decode step aims for two: 2 stages, 26624
    B, hold three."""
    want = getattr(v.heuristic(bucket), kernel)
    for cfg in sorted({want, *v.search_space(bucket)}, key=lambda c: (_distance(c, want), c.label)):
        shared = v.fits(kernel, cfg, target)
        if shared is not None:
            break
    else:
        raise RuntimeError(f"no {v.title} config of {kernel} fits {target.name} ({target.shared_per_block} B)")
    aim = v.resident_aim(kernel, cfg, shape, bucket) if v.resident_aim else 0
    for stages in range(cfg.num_stages - 1, 1, -1):
        if target.programs_by_shared(shared) >= aim:
            break
        fewer = dataclasses.replace(cfg, num_stages=stages)
        fewer_shared = v.fits(kernel, fewer, target)
        if fewer_shared is not None and target.programs_by_shared(fewer_shared) > target.programs_by_shared(shared):
            cfg, shared = fewer, fewer_shared
    return cfg, shared


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
        except variants.DecodeRefused as e:  # the launch's decode check (the AOT step normally refuses it first)
            report.pruned_by_decode += 1
            say(f"{prefix}[{i + 1}/{len(candidates)}] {cfg.label}: {str(e)[:200]} (skipped)")
            continue
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
