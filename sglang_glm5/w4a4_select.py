"""Which MoE path a call takes: W4A16 everywhere, W4A4 (``sglang_glm5.w4a4``) on SM12x for prefill.

``resolve_path(path, device, tokens_per_expert, shape, ...)`` -> "w4a16" | "w4a4":

- "w4a16": always.
- "w4a4": asked for explicitly; a RuntimeError off SM12x CUDA GPUs and without the input scales.
- "auto": "w4a4" only when all hold, else "w4a16":
  1. the device is an SM12x CUDA GPU and both input scales were given;
  2. tokens per expert >= the threshold: $SGLANG_GLM5_W4A4_MIN_TOKENS, else the one ``sglang-glm5
     tune --path w4a4`` stored for this GPU and layer shape, else ``w4a4.MIN_TOKENS_PER_EXPERT``;
  3. the W4A4 self-check (``sglang-glm5 selfcheck --path w4a4``) proved this call's kernels: a record in
     the user cache ($SGLANG_GLM5_CACHE_DIR/w4a4_selfcheck.json) for this GPU name, sm, Triton version
     and layer shape (E, H, I), made with the kernel sources installed now (``kernel_digest``), where
     a. the W4A4 tiles at the bucket sizes it checked are still the ones it ran (``tiles_digest``: a
        later ``tune --path w4a4`` that changes them voids the record), and
     b. the tiles this call gets (``w4a4.pick_config`` at its bucket) are a pair the self-check ran at a
        checked size of at least the threshold tokens per expert. A check at decode sizes only (say
        ``--tokens 1``) proves nothing for prefill; the default counts (7, 256, 2048) reach 64 tokens
        per expert and more. Tiles the tuner stored for a bucket the check did not run are trusted
        only where they equal a pair it ran; elsewhere auto stays on W4A16 and says so once.
     Nobody here has run W4A4 on SM120 hardware, so "auto" trusts it only where a run against the
     float64 reference proved it.

The device facts, records, thresholds and verdicts are read once per device, shape and bucket and
memoized, so a call costs dict lookups; ``clear_memo()`` forgets them (tests, the self-check after
writing, the tuner after storing).

The self-check that writes the record is ``sglang_glm5.w4a4_verify.run_selfcheck``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_glm5 import env, hardware
from sglang_glm5._files import cache_dir, read_json, update_json
from sglang_glm5.tiles import GemmConfig, MoeConfig

log = logging.getLogger("sglang_glm5.w4a4")

PATHS = ("auto", "w4a16", "w4a4")
MIN_TOKENS_ENV = env.W4A4_MIN_TOKENS.name
RECORD_FILE = "w4a4_selfcheck.json"
# The sources a W4A4 call runs: its kernels and host code, and the routing sort, top-k sum and input
# validation it shares with the W4A16 op. A record proves these bytes only.
DIGEST_MODULES = (
    "sglang_glm5.kernels.nvfp4_w4a4",
    "sglang_glm5.w4a4",
    "sglang_glm5.kernels.nvfp4_moe",
    "sglang_glm5.moe",
)


# ---------------------------------------------------------------------------------------------
# Device facts (whether a device can run W4A4 at all: ``hardware.w4a4_problem``).


@dataclass(frozen=True)
class GpuIdentity:
    """What a self-check record is valid for (with the Triton version and the kernel sources)."""

    name: str  # torch.cuda.get_device_name()
    arch: int  # major * 10 + minor

    @classmethod
    def of(cls, device: torch.device) -> GpuIdentity:
        return cls(torch.cuda.get_device_name(device), hardware.device_arch(device))


def _triton_version() -> str:
    import triton

    return triton.__version__


_digest: str | None = None


def kernel_digest() -> str:
    """sha256 (12 hex) of the ``DIGEST_MODULES`` sources: a record proves these sources only."""
    global _digest
    if _digest is None:
        import importlib.util

        h = hashlib.sha256()
        for module in DIGEST_MODULES:
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                raise RuntimeError(f"kernel_digest: expected module {module} to be importable, found none")
            h.update(Path(spec.origin).read_bytes())
        _digest = h.hexdigest()[:12]
    return _digest


# ---------------------------------------------------------------------------------------------
# The self-check record. One entry per GPU, Triton version and layer shape, under
# "NAME|sm_XY|triton=V|E=..,H=..,I=..":
#   passed: true; gpu, arch, triton, torch, kernel_digest, date; shape: [E, H, I];
#   checked: [{tokens_per_expert, bucket, gemm1: {config}, gemm2: {config}}, ...]  the sizes run and their tiles;
#   tiles_digest: tiles_digest() of {bucket: tiles} over the checked buckets;
#   and the self-check's details (shape_name, tokens, seed, rows).


def record_path() -> Path:
    return cache_dir() / RECORD_FILE


def _gpu_key(gpu: GpuIdentity, triton_version: str | None = None) -> str:
    return f"{gpu.name}|sm_{gpu.arch}|triton={triton_version or _triton_version()}"


def record_key(gpu: GpuIdentity, shape, triton_version: str | None = None) -> str:
    e, h, i = _shape_tuple(shape)
    return f"{_gpu_key(gpu, triton_version)}|E={e},H={h},I={i}"


def tiles_in_effect(shape, buckets: Iterable[int], device: torch.device) -> dict[int, MoeConfig]:
    """{bucket: the W4A4 tiles ``w4a4.pick_config`` gives a call of that many tokens per expert on this
    device}: the cache's W4A4 entries for the shape, else the heuristic (memoized by pick_config)."""
    from sglang_glm5.w4a4 import pick_config

    e, h, i = _shape_tuple(shape)
    return {b: pick_config(b, e, h, i, device) for b in sorted(set(buckets))}


def tiles_digest(tiles: dict[int, MoeConfig]) -> str:
    """sha256 (12 hex) of {bucket: (gemm1, gemm2) configs}."""
    rows = [[b, tiles[b].gemm1.as_dict(), tiles[b].gemm2.as_dict()] for b in sorted(tiles)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CheckedSize:
    tokens_per_expert: float
    bucket: int  # autotune.m_bucket(tokens_per_expert)
    tiles: MoeConfig  # what W4A4 ran at that size


@dataclass(frozen=True)
class Record:
    """A passing self-check of one layer shape on this GPU, for the installed kernel sources."""

    shape: tuple[int, int, int]  # (E, H, I)
    checked: tuple[CheckedSize, ...]
    tiles_digest: str

    def problem(self, bucket: int, threshold: float, device: torch.device) -> str | None:
        """None when this record proves a W4A4 call at ``bucket`` (rule 3 of the module docstring);
        otherwise why not, for the log."""
        now = tiles_in_effect(self.shape, (c.bucket for c in self.checked), device)
        if tiles_digest(now) != self.tiles_digest:
            return ("the W4A4 tiles at the sizes it checked changed since (a later `tune --path w4a4`): "
                    "run the self-check again")  # fmt: skip
        tiles = tiles_in_effect(self.shape, (bucket,), device)[bucket]
        if tiles not in {c.tiles for c in self.checked if c.tokens_per_expert >= threshold}:
            return (f"it never ran the tiles of m={bucket} ({tiles.gemm1.label}, {tiles.gemm2.label}) at "
                    f">= {threshold:g} tokens per expert: add such a token count to its --tokens")  # fmt: skip
        return None


def _parse_record(rec: dict) -> Record:
    """A stored record as a Record; TypeError / KeyError / ValueError when malformed."""
    checked = tuple(
        CheckedSize(float(c["tokens_per_expert"]), int(c["bucket"]),
                    MoeConfig(GemmConfig(**c["gemm1"]), GemmConfig(**c["gemm2"])))
        for c in rec["checked"]
    )  # fmt: skip
    if not checked or not isinstance(rec["tiles_digest"], str):
        raise ValueError("expected checked sizes and a tiles_digest string")
    e, h, i = (int(v) for v in rec["shape"])
    return Record((e, h, i), checked, rec["tiles_digest"])


def read_record(gpu: GpuIdentity, shape) -> Record | None:
    """This GPU's record for ``shape`` when it passed for the installed kernel sources; None otherwise
    (a broken file or record: logged)."""
    path = record_path()
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("W4A4 self-check record %s skipped: %s", path, e)
        return None
    key = record_key(gpu, shape)
    rec = data.get(key)
    if not isinstance(rec, dict) or rec.get("passed") is not True:
        return None
    if rec.get("kernel_digest") != kernel_digest():
        log.info("W4A4 self-check record %r is for other kernel sources: run the self-check again", key)
        return None
    try:
        parsed = _parse_record(rec)
    except (TypeError, KeyError, ValueError) as e:
        log.warning("W4A4 self-check record %r in %s skipped: malformed (%s: %s)", key, path, type(e).__name__, e)
        return None
    return parsed if parsed.shape == _shape_tuple(shape) else None


def record_problems() -> list[str]:
    """What is wrong with the record file (``doctor``): not JSON, or records that ``read_record`` would skip
    as malformed; empty when it is fine or absent."""
    path = record_path()
    try:
        data = read_json(path)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        return [f"{e}; every W4A4 self-check pass in it is ignored"]
    problems = []
    for key, rec in data.items():
        try:
            if not isinstance(rec, dict):
                raise TypeError(f"expected an object, got {type(rec).__name__}")
            if rec.get("passed") is True:
                _parse_record(rec)
        except (TypeError, KeyError, ValueError) as e:
            problems.append(f"{path}: record {key!r} is malformed and ignored ({type(e).__name__}: {e})")
    return problems


def write_record(
    gpu: GpuIdentity,
    shape,
    passed: bool,
    details: dict,
    *,
    device: torch.device | None = None,
    tokens_per_expert: Sequence[float] = (),
) -> Path:
    """A pass is stored under this GPU's and shape's key, with the tiles W4A4 ran at each checked size
    (``tiles_in_effect`` on ``device`` now: pick_config memoizes, so these are the ones the check just
    ran). A failure removes every earlier pass of this GPU and Triton version, whatever its shape, and
    stores nothing."""
    from sglang_glm5.autotune import m_bucket

    gpu_key = _gpu_key(gpu)
    value = None
    if passed:
        if device is None or not tokens_per_expert:
            raise ValueError("write_record: a pass needs the device and the tokens per expert it checked")
        tiles = tiles_in_effect(shape, (m_bucket(t) for t in tokens_per_expert), device)
        checked = [
            {"tokens_per_expert": float(t), "bucket": m_bucket(t), "gemm1": tiles[m_bucket(t)].gemm1.as_dict(),
             "gemm2": tiles[m_bucket(t)].gemm2.as_dict()}
            for t in tokens_per_expert
        ]  # fmt: skip
        value = {
            **details,
            "passed": True,
            "gpu": gpu.name,
            "arch": gpu.arch,
            "triton": _triton_version(),
            "torch": torch.__version__,
            "kernel_digest": kernel_digest(),
            "shape": list(_shape_tuple(shape)),
            "checked": checked,
            "tiles_digest": tiles_digest(tiles),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }

    def update(data: dict) -> None:
        if value is not None:
            data[record_key(gpu, shape)] = value
            return
        for key in [k for k in data if k == gpu_key or k.startswith(gpu_key + "|")]:
            del data[key]

    path = record_path()
    update_json(path, update)
    clear_memo()
    return path


# ---------------------------------------------------------------------------------------------
# The threshold.


def min_tokens_from_env() -> float | None:
    """$SGLANG_GLM5_W4A4_MIN_TOKENS as a number of tokens per expert, None when unset."""
    return env.get(env.W4A4_MIN_TOKENS)


def _shape_tuple(shape) -> tuple[int, int, int]:
    """A MoeShape or (E, H, I)."""
    if hasattr(shape, "num_experts"):
        return int(shape.num_experts), int(shape.hidden), int(shape.inter)
    try:
        e, h, i = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape: expected a MoeShape or (E, H, I), got {shape!r}") from None
    return e, h, i


def threshold_for(target, shape) -> float:
    """Tokens per expert from which auto picks W4A4 on ``target`` for ``shape``: env, cache, default.

    A tuner that found W4A4 never faster stored None: then never (infinity).
    """
    from sglang_glm5.shapes import MoeShape
    from sglang_glm5.w4a4 import MIN_TOKENS_PER_EXPERT, load_threshold

    env = min_tokens_from_env()
    if env is not None:
        return env
    stored = load_threshold(target, MoeShape(*_shape_tuple(shape)))
    if stored is None:
        return float(MIN_TOKENS_PER_EXPERT)
    return math.inf if stored["min_tokens_per_expert"] is None else float(stored["min_tokens_per_expert"])


# ---------------------------------------------------------------------------------------------
# resolve_path.


@dataclass(frozen=True)
class _DeviceFacts:
    problem: str | None  # why W4A4 cannot run here; None on SM12x
    device: torch.device  # with its index
    gpu: GpuIdentity | None  # None off SM12x
    target: object  # hardware.GpuTarget, None off SM12x


_devices: dict[tuple[str, int | None], _DeviceFacts] = {}
_records: dict[tuple, Record | None] = {}  # (device key, (E, H, I)) -> the record
_thresholds: dict[tuple, float] = {}  # (device key, (E, H, I)) -> tokens per expert
_verdicts: dict[tuple, str | None] = {}  # (device key, (E, H, I), bucket) -> Record.problem
_told: set[tuple] = set()  # (what, device key, ...) already logged once


def clear_memo() -> None:
    """Forget what resolve_path read (device facts, records, thresholds, verdicts), the kernel digest and
    the W4A4 tiles pick_config memoized."""
    global _digest
    from sglang_glm5 import w4a4

    _digest = None
    for memo in (_devices, _records, _thresholds, _verdicts, _told):
        memo.clear()
    w4a4.clear_memo()


def _facts(device: torch.device) -> tuple[tuple[str, int | None], _DeviceFacts]:
    index = device.index
    if device.type == "cuda" and index is None and torch.cuda.is_available():
        index = torch.cuda.current_device()
    key = (device.type, index)
    facts = _devices.get(key)
    if facts is None:
        dev = torch.device(device.type, index) if index is not None else device
        problem = hardware.w4a4_problem(dev)
        gpu, target = None, None
        if problem is None:
            gpu, target = GpuIdentity.of(dev), hardware.detect(index)
        facts = _devices[key] = _DeviceFacts(problem, dev, gpu, target)
    return key, facts


def _record(key: tuple, facts: _DeviceFacts, shape: tuple[int, int, int]) -> Record | None:
    if (key, shape) not in _records:
        _records[key, shape] = read_record(facts.gpu, shape)
    return _records[key, shape]


def _say_once(what: tuple, message: str, *args) -> None:
    if what not in _told:
        _told.add(what)
        log.info(message, *args)


def resolve_path(
    path: str,
    device: torch.device,
    tokens_per_expert: float,
    shape,
    *,
    w13_input_scale: torch.Tensor | float | None = None,
    w2_input_scale: torch.Tensor | float | None = None,
) -> str:
    """The path one MoE call takes: "w4a16" or "w4a4" (module docstring).

    path: "auto" | "w4a16" | "w4a4"; device: that of hidden_states; tokens_per_expert: T * k / E;
    shape: a MoeShape or (E, H, I) of the local layer; the input scales: the checkpoint's activation
    scales (None when the caller has none: "auto" then stays on W4A16, "w4a4" raises).
    """
    if path == "w4a16":
        return "w4a16"
    if path not in PATHS:
        raise ValueError(f"path: expected one of {', '.join(repr(p) for p in PATHS)}, got {path!r}")
    device = torch.device(device)
    key, facts = _facts(device)
    has_scales = w13_input_scale is not None and w2_input_scale is not None
    if path == "w4a4":
        if facts.problem is not None:
            raise RuntimeError(f"path='w4a4' needs an SM12x (Blackwell workstation) CUDA GPU, got {facts.problem}")
        if not has_scales:
            missing = [n for n, v in (("w13_input_scale", w13_input_scale), ("w2_input_scale", w2_input_scale))
                       if v is None]  # fmt: skip
            raise RuntimeError(
                f"path='w4a4' quantizes activations with the checkpoint's input scales: expected tensors, "
                f"got None for {' and '.join(missing)}"
            )
        shape_t = _shape_tuple(shape)
        if _record(key, facts, shape_t) is None and ("forced", key, shape_t) not in _told:
            _told.add(("forced", key, shape_t))
            log.warning("W4A4 forced on %s for layer E,H,I=%s without a passing `sglang-glm5 selfcheck --path "
                        "w4a4` of that shape here", device, shape_t)  # fmt: skip
        return "w4a4"
    if facts.problem is not None or not has_scales:
        return "w4a16"
    shape_t = _shape_tuple(shape)
    threshold = _thresholds.get((key, shape_t))
    if threshold is None:
        threshold = _thresholds[key, shape_t] = threshold_for(facts.target, shape_t)
    if tokens_per_expert < threshold:
        return "w4a16"
    record = _record(key, facts, shape_t)
    if record is None:
        _say_once(("unproven", key, shape_t), "W4A4 not verified on %s for layer E,H,I=%s (run `sglang-glm5 "
                  "selfcheck --path w4a4 --shape ...` for it): auto stays on W4A16", device, shape_t)  # fmt: skip
        return "w4a16"
    from sglang_glm5.autotune import m_bucket

    bucket = m_bucket(tokens_per_expert)
    verdict_key = (key, shape_t, bucket)
    if verdict_key not in _verdicts:
        _verdicts[verdict_key] = record.problem(bucket, threshold, facts.device)
    problem = _verdicts[verdict_key]
    if problem is not None:
        _say_once(("uncovered",) + verdict_key, "W4A4 self-check record on %s for layer E,H,I=%s does not cover "
                  "m=%d: %s; auto stays on W4A16 there", device, shape_t, bucket, problem)  # fmt: skip
        return "w4a16"
    return "w4a4"
