"""Which MoE path a call takes: W4A16 everywhere, W4A4 (``sglang_glm5.w4a4``) on SM12x for prefill.

``resolve_path(path, device, tokens_per_expert, shape, ...)`` -> "w4a16" | "w4a4":

- "w4a16": always.
- "w4a4": asked for explicitly; a RuntimeError off SM12x CUDA GPUs and without the input scales.
- "auto": "w4a4" only when all hold, else "w4a16":
  1. the device is an SM12x CUDA GPU and both input scales were given;
  2. the W4A4 self-check (``sglang-glm5 selfcheck --path w4a4``) passed on this GPU: a record in the
     user cache ($SGLANG_GLM5_CACHE_DIR/w4a4_selfcheck.json) keyed by GPU name, sm and Triton version,
     for the kernel sources installed now. Nobody here has run W4A4 on SM120 hardware, so "auto"
     trusts it only where a run against the float64 reference proved it;
  3. tokens per expert >= the threshold: $SGLANG_GLM5_W4A4_MIN_TOKENS, else the one ``sglang-glm5
     tune --path w4a4`` stored for this GPU and layer shape, else ``w4a4.MIN_TOKENS_PER_EXPERT``.

The device facts, the record and the threshold are read once per device (and shape) and memoized, so
a call costs a dict lookup; ``clear_memo()`` forgets them (tests, and the self-check after writing).

The self-check that writes the record is ``sglang_glm5.w4a4_verify.run_selfcheck``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_glm5._files import cache_dir, read_json, update_json

log = logging.getLogger("sglang_glm5.w4a4")

PATHS = ("auto", "w4a16", "w4a4")
MIN_TOKENS_ENV = "SGLANG_GLM5_W4A4_MIN_TOKENS"
RECORD_FILE = "w4a4_selfcheck.json"


# ---------------------------------------------------------------------------------------------
# Device facts.


def sm12x_problem(device: torch.device | None) -> str | None:
    """None on an SM12x CUDA device; otherwise what the device is instead (for an error message)."""
    if device is None:
        return "no tensor"
    if device.type != "cuda":
        return str(device)
    if not torch.cuda.is_available():
        return f"{device}, but torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    return None if major == 12 else f"sm_{major}{minor}"


@dataclass(frozen=True)
class GpuIdentity:
    """What a self-check record is valid for (with the Triton version and the kernel sources)."""

    name: str  # torch.cuda.get_device_name()
    arch: int  # major * 10 + minor

    @classmethod
    def of(cls, device: torch.device) -> GpuIdentity:
        major, minor = torch.cuda.get_device_capability(device)
        return cls(torch.cuda.get_device_name(device), major * 10 + minor)


def _triton_version() -> str:
    import triton

    return triton.__version__


_digest: str | None = None


def kernel_digest() -> str:
    """sha256 (12 hex) of the W4A4 kernel and host sources: a record proves these sources only."""
    global _digest
    if _digest is None:
        import importlib.util

        h = hashlib.sha256()
        for module in ("sglang_glm5.kernels.nvfp4_w4a4", "sglang_glm5.w4a4"):
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                raise RuntimeError(f"kernel_digest: expected module {module} to be importable, found none")
            h.update(Path(spec.origin).read_bytes())
        _digest = h.hexdigest()[:12]
    return _digest


# ---------------------------------------------------------------------------------------------
# The self-check record.


def record_path() -> Path:
    return cache_dir() / RECORD_FILE


def record_key(gpu: GpuIdentity, triton_version: str | None = None) -> str:
    return f"{gpu.name}|sm_{gpu.arch}|triton={triton_version or _triton_version()}"


def read_record(gpu: GpuIdentity) -> dict | None:
    """This GPU's record when it passed for the installed kernels; None otherwise (a broken file: logged)."""
    path = record_path()
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("W4A4 self-check record %s skipped: %s", path, e)
        return None
    rec = data.get(record_key(gpu))
    if not isinstance(rec, dict) or rec.get("passed") is not True:
        return None
    if rec.get("kernel_digest") != kernel_digest():
        log.info("W4A4 self-check record for %s is for other kernel sources: run the self-check again", gpu.name)
        return None
    return rec


def write_record(gpu: GpuIdentity, passed: bool, details: dict) -> Path:
    """A pass is stored under this GPU's key; a failure removes an earlier pass (and stores nothing)."""
    key = record_key(gpu)

    def update(data: dict) -> None:
        if passed:
            data[key] = {
                **details,
                "passed": True,
                "gpu": gpu.name,
                "arch": gpu.arch,
                "triton": _triton_version(),
                "torch": torch.__version__,
                "kernel_digest": kernel_digest(),
                "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            }
        else:
            data.pop(key, None)

    path = record_path()
    update_json(path, update)
    clear_memo()
    return path


# ---------------------------------------------------------------------------------------------
# The threshold.


def min_tokens_from_env() -> float | None:
    """$SGLANG_GLM5_W4A4_MIN_TOKENS as a number of tokens per expert, None when unset."""
    text = os.environ.get(MIN_TOKENS_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{MIN_TOKENS_ENV}: expected a number of tokens per expert >= 0, got {text!r}")
    return value


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
    from sglang_glm5 import autotune
    from sglang_glm5.shapes import MoeShape
    from sglang_glm5.w4a4 import MIN_TOKENS_PER_EXPERT

    env = min_tokens_from_env()
    if env is not None:
        return env
    stored = autotune.load_w4a4_threshold(target, MoeShape(*_shape_tuple(shape)))
    if stored is None:
        return float(MIN_TOKENS_PER_EXPERT)
    return math.inf if stored["min_tokens_per_expert"] is None else float(stored["min_tokens_per_expert"])


# ---------------------------------------------------------------------------------------------
# resolve_path.


@dataclass(frozen=True)
class _DeviceFacts:
    problem: str | None  # why W4A4 cannot run here; None on SM12x
    proven: bool  # a passing self-check record exists for this GPU and these kernels
    target: object  # hardware.GpuTarget, None off SM12x


_devices: dict[tuple[str, int | None], _DeviceFacts] = {}
_thresholds: dict[tuple, float] = {}
_told: set[tuple] = set()  # (what, device key) already logged once


def clear_memo() -> None:
    """Forget what resolve_path read (device facts, records, thresholds)."""
    _devices.clear()
    _thresholds.clear()
    _told.clear()


def _facts(device: torch.device) -> tuple[tuple[str, int | None], _DeviceFacts]:
    index = device.index
    if device.type == "cuda" and index is None and torch.cuda.is_available():
        index = torch.cuda.current_device()
    key = (device.type, index)
    facts = _devices.get(key)
    if facts is None:
        dev = torch.device(device.type, index) if index is not None else device
        problem = sm12x_problem(dev)
        proven, target = False, None
        if problem is None:
            from sglang_glm5 import hardware

            proven = read_record(GpuIdentity.of(dev)) is not None
            target = hardware.detect(index)
        facts = _devices[key] = _DeviceFacts(problem, proven, target)
    return key, facts


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
        if not facts.proven and ("forced", key) not in _told:
            _told.add(("forced", key))
            log.warning("W4A4 forced on %s without a passing `sglang-glm5 selfcheck --path w4a4` here", device)
        return "w4a4"
    if facts.problem is not None or not has_scales:
        return "w4a16"
    shape_key = (key, _shape_tuple(shape))
    threshold = _thresholds.get(shape_key)
    if threshold is None:
        threshold = _thresholds[shape_key] = threshold_for(facts.target, shape)
    if tokens_per_expert < threshold:
        return "w4a16"
    if not facts.proven:
        if ("unproven", key) not in _told:
            _told.add(("unproven", key))
            log.info("W4A4 not verified on %s (run `sglang-glm5 selfcheck --path w4a4`): auto stays on W4A16", device)
        return "w4a16"
    return "w4a4"
