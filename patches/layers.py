"""Every MoE layer of a model under ``nvfp4_triton``: NVFP4 layers on our op, any other on SGLang's stock runner.

SGLang builds each ``FusedMoE`` layer with the process-wide runner backend (``get_flags().moe.runner_backend``, set
from ``--moe-runner-backend``; while a draft model is built and run, ``speculative_moe_backend_context`` in
``srt/layers/moe/utils.py`` puts ``--speculative-moe-runner-backend`` there, which defaults to the target's, see
``_default_speculative_moe_runner_backend``). A MoE layer's quantization method picks its runner from that value:

- ``ModelOptNvFp4FusedMoEMethod`` (NVFP4 experts): hooked in ``nvfp4_moe``, runs on ``sglang_glm5.moe``;
- ``UnquantizedFusedMoEMethod`` (BF16 experts, e.g. the MTP layer of the GLM-5 NVFP4 checkpoints, which SGLang's
  NextN model builds without a quantization config): picks SGLang's Triton runner whatever the backend;
- other methods (FP8, MXFP4, ...) read the backend in ``create_moe_runner``; given a name they do not know they
  take it for a direct kernel and fail later.

The hook on ``FusedMoE.__init__``: when the backend is ``nvfp4_triton``, the layer is built with the backend
``auto``, which is what a stock server gives a layer of that quantization (each method's own default runner). When
the layer's quantization method turns out to be NVFP4, ``nvfp4_moe.init_hook`` puts ``nvfp4_triton`` back for the
rest of that layer's construction (``claim_layer``), so NVFP4 layers take our op. After construction the layer's
kind (quantization method, runner, target or draft) is logged once per kind. With any other backend the original
``__init__`` runs untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging

from sglang_glm5.patches.guard import BACKEND_NAME
from sglang_glm5.patches.hooks import MethodHook, Symbol

logger = logging.getLogger("sglang_glm5.patches")

_LAYER = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"
STOCK_BACKEND = "auto"  # what a non-NVFP4 layer is built with: each quantization method's own default runner


class _Build:
    """A FusedMoE construction for nvfp4_triton: the backend to put back, and whether an NVFP4 method claimed it."""

    def __init__(self, ours):
        self.ours, self.claimed = ours, False


_building: contextvars.ContextVar[_Build | None] = contextvars.ContextVar("sglang_glm5_building", default=None)
_logged_kinds: set[tuple[str, str, bool]] = set()


def _is_ours(backend) -> bool:
    return getattr(backend, "value", backend) == BACKEND_NAME


@contextlib.contextmanager
def _runner_backend(value):
    """The process-wide MoE runner backend set to ``value``, restored on exit (as SGLang's own
    ``speculative_moe_backend_context`` does)."""
    from sglang.srt.runtime_context import get_flags

    moe = get_flags().moe
    saved = moe.runner_backend
    moe.runner_backend = value
    try:
        yield
    finally:
        moe.runner_backend = saved


def building_for_us() -> bool:
    """True inside the construction of a FusedMoE layer that nvfp4_triton was asked for."""
    return _building.get() is not None


def claim_layer() -> None:
    """Called by the NVFP4 method's __init__ during such a construction: nvfp4_triton for the rest of this layer."""
    from sglang.srt.runtime_context import get_flags

    build = _building.get()
    if build is None:
        raise RuntimeError("claim_layer() outside a FusedMoE construction for nvfp4_triton")
    build.claimed = True
    get_flags().moe.runner_backend = build.ours


def fused_moe_init_hook(original, self, *args, **kwargs):
    from sglang.srt.layers.moe.utils import get_moe_runner_backend, resolve_moe_runner_backend

    ours = get_moe_runner_backend()
    if not _is_ours(ours):
        return original(self, *args, **kwargs)
    build = _Build(ours)
    token = _building.set(build)
    try:
        with _runner_backend(resolve_moe_runner_backend(STOCK_BACKEND)):
            original(self, *args, **kwargs)
    finally:
        _building.reset(token)
    _check_and_log(self, build.claimed)


def _check_and_log(layer, claimed: bool) -> None:
    method = type(layer.quant_method).__name__
    runner = getattr(layer.runner_backend, "value", str(layer.runner_backend))
    if _is_ours(runner) and not claimed:
        raise NotImplementedError(
            f"--moe-runner-backend {BACKEND_NAME}: MoE layer {layer.layer_id} ({method}) expected SGLang's stock "
            f"runner for its quantization, got {BACKEND_NAME}"
        )
    draft = bool(getattr(layer, "is_draft", False))
    kind = (method, runner, draft)
    if kind in _logged_kinds:
        return
    _logged_kinds.add(kind)
    where = "our NVFP4 op (sglang_glm5.moe)" if _is_ours(runner) else f"SGLang's stock {runner} runner"
    logger.info(
        "sglang-glm5: %s MoE layers with %s run on %s (first: layer %s; logged once per kind)",
        "draft" if draft else "target", method, where, layer.layer_id,
    )  # fmt: skip


def logged_kinds() -> frozenset[tuple[str, str, bool]]:
    """(quantization method, runner backend, draft) of every layer kind built under nvfp4_triton so far."""
    return frozenset(_logged_kinds)


def forget_kinds() -> None:
    _logged_kinds.clear()


HOOKS = (MethodHook(Symbol(f"{_LAYER}.__init__"), fused_moe_init_hook),)

SYMBOLS = (
    Symbol("sglang.srt.runtime_context.get_flags", ()),
    Symbol("sglang.srt.layers.moe.utils.resolve_moe_runner_backend", ("backend",)),
)
