"""The tile-config cache (the tuner that fills it: ``tuner``).

Cache key: owner, kernel, GEMM shape (E, N, K), bucket of tokens per expert (a power of two, or at most one
half a decode step, a multiple of 1/32, where one was tuned: ``step_of``). Value:
the config, its shared memory on the target, its measured time in ms (or ``measured: false`` when
chosen offline), the Triton version.

The owner is whom an entry speaks for (``owner``). A measured entry is a time taken on one kind of GPU:
"NAME|sm_XY", the target's short name and arch (``h200|sm_90``). An unmeasured entry is a config the
shared-memory model and Triton's ahead-of-time compile for sm_XY found feasible, a fact about the
architecture and the shared memory per block: "sm_XY|shared=BYTES" (``sm_120|shared=101376``), read by
every GPU that has both (an RTX PRO 6000 Workstation, Server or Max-Q, an RTX 5090). A lookup prefers
the target's measured entry to its architecture's unmeasured one, and between the two reads the measured entries
of its siblings (``siblings``: known GPUs with its architecture, SM count and shared memory per block; an H100 SXM
reads the H200's). Unmeasured entries stored under "NAME|sm_XY" by earlier versions are still read by that target.

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
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path

from sglang_glm5 import variants
from sglang_glm5._files import cache_dir, read_json, update_json
from sglang_glm5.hardware import TARGETS, GpuTarget
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import KernelVariant

log = logging.getLogger("sglang_glm5.autotune")
MAX_BUCKET = 4096


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
    pays depends on the step's own blocks, and one tuned at an octave bucket's top step loses lower in the bucket
    (GLM-5 B = 9: 1.14x at EP8). Without one, a lookup reads the octave bucket (``bucket_of``)."""
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
# tile choice changes slowly with m (the H200's tuning over buckets 1-2048), and an entry measured near m beats a guess.
NEAREST_OCTAVES = 2
# Lookups remembered by a call's exact tokens per expert (T * k / E: one value per token count a server sees, a few
# thousand up to its chunk size); past this many entries new values take the bucket path each call.
MEMO_CALL_KEYS = 8192


def owner(target: GpuTarget, *, measured: bool) -> str:
    """The first two fields of an entry's key (module docstring): "NAME|sm_XY" for a measured entry,
    "sm_XY|shared=BYTES" for an unmeasured one."""
    if measured:
        return f"{target.name}|sm_{target.arch}"
    return f"sm_{target.arch}|shared={target.shared_per_block}"


def siblings(target: GpuTarget) -> list[GpuTarget]:
    """The known GPUs (``hardware.TARGETS``) other than ``target`` with its architecture, SM count and shared memory
    per block: the same tiles fit and fill them, so a tile measured on one is a measured guess for the other (an
    H100 SXM reads the H200's entries). On an H100 the H200's entries make the op 0.69-0.97x its time with the
    heuristic tiles at GLM-5 real routing, B = 1-256."""
    same = (target.arch, target.sm_count, target.shared_per_block)
    kin = [t for t in TARGETS.values() if t.name != target.name and (t.arch, t.sm_count, t.shared_per_block) == same]
    return sorted(kin, key=lambda t: t.name)


def owners(target: GpuTarget) -> tuple[str, ...]:
    """The owners whose entries a target reads, preferred first: its own measured ones, its siblings' measured ones
    (``siblings``, by name), then its architecture's unmeasured ones."""
    kin = tuple(owner(t, measured=True) for t in siblings(target))
    return owner(target, measured=True), *kin, owner(target, measured=False)


def cache_key(
    target: GpuTarget, kernel: str, enk: tuple[int, int, int], bucket: Bucket, *, measured: bool,
    variant: KernelVariant | None = None,
) -> str:  # fmt: skip
    """The entry's key for a GEMM of a kernel family (default W4A16); the family's revision in it retires
    entries tuned for an earlier kernel design."""
    return owned_key(owner(target, measured=measured), kernel, enk, bucket, variant)


def owned_key(who: str, kernel: str, enk: tuple[int, int, int], bucket: Bucket,
              variant: KernelVariant | None = None) -> str:  # fmt: skip
    """``cache_key`` with the owner given (``owners``)."""
    e, n, k = enk
    field = (variant or variants.get("w4a16")).key_kernel(kernel)
    return f"{who}|{field}|E={e},N={n},K={k}|m={bucket}"


def key_owner(key: str) -> str:
    """An entry key's owner (its first two fields, ``owner``)."""
    return "|".join(key.split("|")[:2])


def key_kernel_field(key: str) -> str:
    """An entry key's kernel field (``KernelVariant.key_kernel``: the kernel and its family's revision); "" for a key
    too short to have one."""
    fields = key.split("|")
    return fields[2] if len(fields) > 2 else ""


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
    heuristic. At each bucket the target's measured entry comes first, then its siblings', then its architecture's
    unmeasured one.
    Each kernel family (``variants``) reads its own entries, by the kernel field of their keys.
    """

    def __init__(self, target: GpuTarget, paths: Iterable[Path] | None = None):
        self.target = target
        self.owners = owners(target)  # whose entries it reads, preferred first
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
        # by the call's own tokens per expert first: bucket_of and step_of work in Fractions (tens of microseconds a
        # call, against a dictionary lookup here), and a server calls with a few distinct values
        call_key = (path, shape.num_experts, shape.hidden, shape.inter, tokens_per_expert)
        cfg = self._memo.get(call_key)
        if cfg is not None:
            return cfg
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
        if len(self._memo) < MEMO_CALL_KEYS:
            self._memo[call_key] = cfg
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
                # to other steps): another bucket borrows the tile, the grid is the plan's.
                return dataclasses.replace(entry, config=entry.config.without_plan())
            return entry
        return None

    def _exact(self, variant: KernelVariant, kernel: str, enk: tuple[int, int, int], bucket: Bucket) -> Entry | None:
        """The entry stored under this very bucket (by ``owners``: measured here first) that the family's kernels
        can run."""
        for who in self.owners:
            key = owned_key(who, kernel, enk, bucket, variant)
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
