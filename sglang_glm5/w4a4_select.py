"""Which MoE path a call takes: W4A16 everywhere, W4A4 (``sglang_glm5.w4a4``) on SM12x for prefill.

``resolve_path(path, device, tokens_per_expert, shape, has_input_scales=...)`` -> "w4a16" | "w4a4":

- "w4a16": always.
- "w4a4" (``SGLANG_GLM5_MOE_PATH=w4a4``): forced; a RuntimeError off SM12x CUDA GPUs and without the
  input scales.
- "auto": "w4a4" only when all hold, else "w4a16":
  1. the device is an SM12x CUDA GPU and the layer's weights carry the input scales;
  2. ``sglang-glm5 tune --path w4a4`` ran on a GPU of this kind for this layer shape and stored a measured
     threshold. That run times W4A4 against W4A16 and checks W4A4 against the float64 reference with the
     tiles it picked at each bucket it tuned; it stores the threshold and those buckets only when every
     check passes, under W4A4's kernel revision (a failing re-tune removes the earlier threshold).
  3. tokens per expert >= that threshold ($SGLANG_GLM5_W4A4_MIN_TOKENS replaces the number, not the need
     for a passing tune; a tune that found W4A4 never faster means never, whatever the switch says);
  4. the call's bucket (``autotune.m_bucket``) is one the tune checked: W4A4 never runs tiles that no check ran.
  Nobody here has run W4A4 on SM120 hardware, so "auto" takes it only where a run on the GPU proved it.

The device facts and thresholds are read once per device and shape and memoized, so a call costs dict
lookups; ``clear_memo()`` forgets them (tests, the tuner after storing).
"""

from __future__ import annotations

import logging
import math

import torch

from sglang_glm5 import env, hardware, variants

log = logging.getLogger("sglang_glm5.w4a4")

# The paths ``resolve_path`` takes: whether W4A4 serves a call (dense prefill is the op's choice after it, by size).
PATHS = tuple(p for p in variants.PATHS if p != "dense")


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


def threshold_for(target, shape) -> tuple[float, frozenset[int]] | None:
    """(tokens per expert from which auto picks W4A4 on ``target`` for ``shape``, the buckets whose tiles
    the tune checked); None when no passing ``tune --path w4a4`` measured one (then never); an infinite
    threshold when it found W4A4 never faster."""
    from sglang_glm5.shapes import MoeShape
    from sglang_glm5.w4a4 import load_threshold

    stored = load_threshold(target, MoeShape(*_shape_tuple(shape)))
    if stored is None:
        return None
    checked = frozenset(stored["checked_buckets"])
    if stored["min_tokens_per_expert"] is None:
        return math.inf, checked
    override = min_tokens_from_env()
    return (float(stored["min_tokens_per_expert"]) if override is None else override), checked


_devices: dict[tuple[str, int | None], tuple[str | None, object]] = {}  # -> (why not W4A4, GpuTarget)
_thresholds: dict[tuple, tuple[float, frozenset[int]] | None] = {}  # (device key, (E, H, I)) -> threshold_for
_told: set[tuple] = set()  # (what, device key, shape) already logged once


def clear_memo() -> None:
    """Forget what resolve_path read (device facts, thresholds) and the tiles ``autotune.pick_config`` read."""
    from sglang_glm5 import autotune

    for memo in (_devices, _thresholds, _told):
        memo.clear()
    autotune.forget_device_caches()


def _facts(device: torch.device) -> tuple[tuple[str, int | None], str | None, object]:
    index = device.index
    if device.type == "cuda" and index is None and torch.cuda.is_available():
        index = torch.cuda.current_device()
    key = (device.type, index)
    if key not in _devices:
        dev = torch.device(device.type, index) if index is not None else device
        problem = hardware.w4a4_problem(dev)
        _devices[key] = (problem, hardware.detect(index) if problem is None else None)
    return (key, *_devices[key])


def _say_once(what: tuple, message: str, *args) -> None:
    if what not in _told:
        _told.add(what)
        log.info(message, *args)


def _stored_threshold(key, target, shape_t: tuple[int, int, int]) -> tuple[float, frozenset[int]] | None:
    """``threshold_for`` the device ``_facts`` keyed, memoized."""
    if (key, shape_t) not in _thresholds:
        _thresholds[key, shape_t] = threshold_for(target, shape_t)
    return _thresholds[key, shape_t]


def may_take_w4a4(path: str, device: torch.device, shape, *, has_input_scales: bool) -> bool:
    """Whether a layer may take W4A4 at some size: forced ("w4a4"), or "auto" where ``resolve_path`` would
    at a size at or above a stored finite threshold. Such a layer keeps the checkpoint's codes and scales
    (``Nvfp4MoeWeights.for_device``), which the W4A4 kernels read; the others get the W4A16 kernel layout."""
    if path == "w4a4":
        return True
    if path != "auto":
        return False
    key, problem, target = _facts(torch.device(device))
    if problem is not None or not has_input_scales:
        return False
    found = _stored_threshold(key, target, _shape_tuple(shape))
    return found is not None and math.isfinite(found[0]) and bool(found[1])


def resolve_path(path: str, device: torch.device, tokens_per_expert: float, shape, *, has_input_scales: bool) -> str:
    """The path one MoE call takes: "w4a16" or "w4a4" (module docstring).

    path: "auto" | "w4a16" | "w4a4"; device: that of hidden_states; tokens_per_expert: T * k / E;
    shape: a MoeShape or (E, H, I) of the local layer; has_input_scales: whether the weights carry the
    checkpoint's activation scales ("auto" stays on W4A16 without them, "w4a4" raises).
    """
    if path == "w4a16":
        return "w4a16"
    if path not in PATHS:
        raise ValueError(f"path: expected one of {', '.join(repr(p) for p in PATHS)}, got {path!r}")
    key, problem, target = _facts(torch.device(device))
    if path == "w4a4":
        if problem is not None:
            raise RuntimeError(f"path='w4a4' needs an SM12x (Blackwell workstation) CUDA GPU, got {problem}")
        if not has_input_scales:
            raise RuntimeError("path='w4a4' quantizes activations with the checkpoint's input scales: expected "
                               "w13_input_scale and w2_input_scale, got none")  # fmt: skip
        return "w4a4"
    if problem is not None or not has_input_scales:
        return "w4a16"
    shape_t = _shape_tuple(shape)
    found = _stored_threshold(key, target, shape_t)
    if found is None:
        _say_once(("untuned", key, shape_t), "W4A4 not tuned and checked on %s for layer E,H,I=%s (run "
                  "`sglang-glm5 tune --target local --path w4a4 --shape E,H,I` there): auto stays on W4A16",
                  device, shape_t)  # fmt: skip
        return "w4a16"
    from sglang_glm5.autotune import m_bucket

    threshold, checked = found
    return "w4a4" if tokens_per_expert >= threshold and m_bucket(tokens_per_expert) in checked else "w4a16"
