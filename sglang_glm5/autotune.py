"""The tile-config cache and the tuner.

Cache key: target (short name and arch), kernel, GEMM shape (E, N, K), bucket of tokens per expert
(a power of two). Value: the config, its shared memory on the target, its measured time in ms (or
``measured: false`` when chosen offline), the Triton version.

Lookup order: the user's cache ($SGLANG_GLM5_CACHE_DIR, default ~/.cache/sglang_glm5), then the
caches shipped in ``configs/autotune/``, then ``tiles.heuristic_config``. A file that cannot be read,
or an entry that is malformed or no longer fits the target's shared memory, is reported once and
skipped: a cache never stops a server. Writes are locked and atomic, so 8 ranks may tune at once.

Tuning happens offline (``sglang-glm5 tune``), never inside a request.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sglang_glm5 import tiles
from sglang_glm5._files import cache_dir, read_json, update_json
from sglang_glm5.hardware import GpuTarget
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig, MoeConfig

log = logging.getLogger("sglang_glm5.autotune")
MAX_BUCKET = 4096


def m_bucket(tokens_per_expert: float) -> int:
    """The smallest power of two >= tokens per expert, within [1, MAX_BUCKET]."""
    b = 1
    while b < tokens_per_expert and b < MAX_BUCKET:
        b *= 2
    return b


def gemm_shape(kernel: str, shape: MoeShape) -> tuple[int, int, int]:
    """(E, N, K) of one GEMM of the layer: gemm1 [2I x H], gemm2 [H x I]."""
    if kernel == "gemm1":
        return shape.num_experts, 2 * shape.inter, shape.hidden
    return shape.num_experts, shape.hidden, shape.inter


def cache_key(target: GpuTarget, kernel: str, enk: tuple[int, int, int], bucket: int) -> str:
    e, n, k = enk
    return f"{target.name}|sm_{target.arch}|{kernel}|E={e},N={n},K={k}|m={bucket}"


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


def shipped_cache_path(target: GpuTarget) -> Path:
    return Path(str(resources.files("sglang_glm5.configs"))) / "autotune" / f"{target.name}.json"


def user_cache_path(target: GpuTarget) -> Path:
    return cache_dir() / "autotune" / f"{target.name}.json"


_reported: set[str] = set()


def _report_once(message: str) -> None:
    if message not in _reported:
        _reported.add(message)
        log.warning(message)


def _parse_entry(key: str, raw: object, target: GpuTarget, path: Path) -> Entry | None:
    try:
        entry = Entry(GemmConfig(**raw["config"]), int(raw["shared_bytes"]), raw.get("ms"), str(raw["triton"]))
    except (TypeError, KeyError, ValueError) as e:
        _report_once(f"{path}: skipping malformed entry {key!r} ({type(e).__name__}: {e})")
        return None
    if not target.fits(entry.shared_bytes):
        _report_once(
            f"{path}: skipping {key!r}: {entry.shared_bytes} B of shared memory exceeds {target.name}'s "
            f"{target.shared_per_block} B"
        )
        return None
    return entry


def _load_entries(path: Path, target: GpuTarget) -> dict[str, Entry]:
    try:
        data = read_json(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        _report_once(f"autotune cache {path} skipped: {e}")
        return {}
    raw = data.get("entries", {})
    if not isinstance(raw, dict):
        _report_once(f"autotune cache {path} skipped: 'entries' is not an object")
        return {}
    out = {}
    for key, value in raw.items():
        entry = _parse_entry(key, value, target, path)
        if entry is not None:
            out[key] = entry
    return out


class ConfigCache:
    """Entries for one target, from the user cache over the shipped one; memoized lookups.

    Only the exact bucket counts: borrowing the nearest tuned bucket was measured slower than the
    heuristic on H200 (m=32 took 1.64 ms with the m=16 tiles against 1.17 ms heuristic).
    """

    def __init__(self, target: GpuTarget, paths: Iterable[Path] | None = None):
        self.target = target
        self.paths = list(paths) if paths is not None else [user_cache_path(target), shipped_cache_path(target)]
        self.entries: dict[str, Entry] = {}
        for path in reversed(self.paths):  # earlier paths win
            self.entries.update(_load_entries(path, target))
        self._memo: dict[tuple, MoeConfig] = {}

    def lookup(self, shape: MoeShape, tokens_per_expert: float) -> MoeConfig:
        bucket = m_bucket(tokens_per_expert)
        memo_key = (shape.num_experts, shape.hidden, shape.inter, bucket)
        cfg = self._memo.get(memo_key)
        if cfg is None:
            fallback = tiles.heuristic_config(tokens_per_expert)
            found = [self.entries.get(cache_key(self.target, k, gemm_shape(k, shape), bucket)) for k in tiles.KERNELS]
            cfg = MoeConfig(
                gemm1=found[0].config if found[0] else fallback.gemm1,
                gemm2=found[1].config if found[1] else fallback.gemm2,
            )
            self._memo[memo_key] = cfg
        return cfg


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


def search_space(bucket: int) -> list[GemmConfig]:
    """Candidate configs for a bucket of tokens per expert; small block_m for decode sizes."""
    block_ms = [16] if bucket <= 16 else [16, 32] if bucket <= 32 else [32, 64] if bucket <= 64 else [64, 128]
    out = []
    # block_k 256 and 3 stages never won a sweep on H200 (bench/h200/h200_sweep.log): left out.
    for bm, bn, bk, stages in itertools.product(block_ms, (32, 64, 128), (64, 128), (2, 4)):
        for warps in (4, 8) if bm * bn >= 64 * 64 else (2, 4):
            out.append(GemmConfig(bm, bn, bk, warps, stages))
    return out


@dataclass
class TuneReport:
    candidates: int = 0
    pruned_by_model: int = 0
    pruned_by_compiler: int = 0
    benchmarked: int = 0
    bench_seconds: float = 0.0

    @property
    def pruned(self) -> int:
        return self.pruned_by_model + self.pruned_by_compiler

    def summary(self) -> str:
        per = self.bench_seconds / self.benchmarked if self.benchmarked else 0.0
        saved = f", about {self.pruned * per:.0f} s of benchmarking saved" if self.benchmarked else ""
        return (
            f"{self.candidates} candidates, {self.pruned} pruned as infeasible ({self.pruned_by_model} by the model, "
            f"{self.pruned_by_compiler} by the compiler), {self.benchmarked} benchmarked{saved}"
        )


Bench = Callable[[str, GemmConfig, int], float]  # (kernel, config, bucket) -> median ms


def feasible_candidates(
    kernel: str, bucket: int, target: GpuTarget, report: TuneReport, compile_check: bool = True
) -> list[tuple[GemmConfig, int]]:
    """Candidates that fit the target's shared memory, with their shared bytes (compiled, else modelled)."""
    fits_model = []
    for cfg in search_space(bucket):
        report.candidates += 1
        if target.fits(tiles.model_shared_bytes(kernel, cfg, target)):
            fits_model.append(cfg)
        else:
            report.pruned_by_model += 1
    if not compile_check:
        return [(cfg, tiles.model_shared_bytes(kernel, cfg, target)) for cfg in fits_model]
    out = []
    compiled = tiles.compiled_shared_bytes_many([(kernel, cfg) for cfg in fits_model], target)
    for cfg, shared in zip(fits_model, compiled, strict=True):
        if target.fits(shared):
            out.append((cfg, shared))
        else:
            report.pruned_by_compiler += 1
    return out


def tune(
    target: GpuTarget,
    shape: MoeShape,
    buckets: Iterable[int],
    bench: Bench | None,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Entry], TuneReport]:
    """Pick a config per (kernel, bucket). With ``bench`` (the target is the local GPU) every feasible
    candidate is timed and the fastest kept; without it the heuristic's pick is kept when feasible,
    else the feasible candidate nearest to it, marked unmeasured."""
    import triton

    report = TuneReport()
    results: dict[str, Entry] = {}
    say = progress or (lambda _msg: None)
    for kernel, bucket in itertools.product(tiles.KERNELS, buckets):
        key = cache_key(target, kernel, gemm_shape(kernel, shape), bucket)
        if bench is None:
            # Offline: the model-feasible candidate nearest the heuristic's pick that also compiles
            # within the limit; one or two AOT compiles instead of the whole space.
            want = getattr(tiles.heuristic_config(bucket), kernel)
            chosen = None
            for cfg in sorted(search_space(bucket), key=lambda c: _distance(c, want)):
                if target.fits(tiles.model_shared_bytes(kernel, cfg, target)):
                    shared = tiles.compiled_shared_bytes(kernel, cfg, target)
                    if target.fits(shared):
                        chosen = (cfg, shared)
                        break
            if chosen is None:
                raise RuntimeError(f"no config of {kernel} fits {target.name} ({target.shared_per_block} B)")
            results[key] = Entry(chosen[0], chosen[1], None, triton.__version__)
            say(f"{key}: {chosen[0].label} ({chosen[1]} B, not measured)")
            continue
        feasible = feasible_candidates(kernel, bucket, target, report)
        if not feasible:
            raise RuntimeError(f"no config of {kernel} fits {target.name} ({target.shared_per_block} B) at m={bucket}")
        best: tuple[float, GemmConfig, int] | None = None
        for i, (cfg, shared) in enumerate(feasible):
            t0 = time.perf_counter()
            ms = bench(kernel, cfg, bucket)
            report.bench_seconds += time.perf_counter() - t0
            report.benchmarked += 1
            if best is None or ms < best[0]:
                best = (ms, cfg, shared)
            say(f"{key}: [{i + 1}/{len(feasible)}] {cfg.label} {ms:.4f} ms (best {best[0]:.4f} ms, {best[1].label})")
        ms, cfg, shared = best
        results[key] = Entry(cfg, shared, ms, triton.__version__)
    return results, report


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
