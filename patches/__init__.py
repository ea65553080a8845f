"""The SGLang plugin: routes ModelOpt NVFP4 MoE layers to sglang_glm5's Triton op under
``--moe-runner-backend nvfp4_triton`` (and ``--speculative-moe-runner-backend nvfp4_triton`` for a draft model);
every other MoE layer of the model (unquantized, FP8, ...) is built with SGLang's stock runner for its
quantization, chosen per layer (``layers``).

SGLang finds ``plugin`` through the ``sglang.srt.plugins`` entry point and calls it from
``load_plugins()`` in the launcher and again in every scheduler / tensor-parallel worker.
Importing this package changes nothing; ``plugin()`` (or ``apply()``) does, once per process.

- ``SGLANG_GLM5_DISABLE=1``: the plugin does nothing.
- Every ``SGLANG_GLM5_*`` switch is checked when the plugin loads (``env.problems``): a bad value stops
  a launcher that asks for ``nvfp4_triton``, and is logged otherwise; an unknown name is logged.
- ``SGLANG_GLM5_MOE_PATH`` = auto (default) | w4a16 | w4a4: the path the hooked ``apply`` asks the op for
  (``nvfp4_moe.moe_path_from_env``); read and checked when a layer's weights are processed, so a bad
  value, or w4a4 on a GPU that is not SM12x, stops the server at load time.
- On SM12x GPUs, ``SGLANG_MOE_CONFIG_DIR`` is pointed at SM120-feasible configs for SGLang's own
  Triton MoE kernel when asked for and unset (``stock_configs``; opt-in: ``SGLANG_GLM5_STOCK_CONFIGS=1``).
- An SGLang version not in ``guard.SUPPORTED_SGLANG_VERSIONS``: one log line, nothing changed; a
  command line asking for ``nvfp4_triton`` then stops at start-up with a message naming the
  supported versions.
- A hooked or called SGLang symbol that moved: ``PatchTargetError`` naming it, before any change.
- With any other backend every hook calls SGLang's original: a baseline server is the stock one.
"""

from __future__ import annotations

import logging

from sglang_glm5 import env
from sglang_glm5.patches import guard, stock_configs
from sglang_glm5.patches.guard import BACKEND_NAME, SUPPORTED_SGLANG_VERSIONS
from sglang_glm5.patches.hooks import PatchTargetError

__all__ = [
    "BACKEND_NAME",
    "SUPPORTED_SGLANG_VERSIONS",
    "PatchTargetError",
    "apply",
    "check_targets",
    "is_applied",
    "plugin",
    "undo",
]

logger = logging.getLogger("sglang_glm5.patches")

_applied = False


def _all_hooks() -> tuple:
    from sglang_glm5.patches import layers, nvfp4_moe

    return (*nvfp4_moe.HOOKS, *layers.HOOKS)


def check_targets(with_hooks: tuple | None = None) -> None:
    """Resolve every SGLang symbol the plugin hooks or calls; raises PatchTargetError on the first moved one."""
    from sglang_glm5.patches import backend, hooks, layers, nvfp4_moe

    targets = (h.target for h in (_all_hooks() if with_hooks is None else with_hooks))
    hooks.check((*backend.SYMBOLS, *nvfp4_moe.SYMBOLS, *layers.SYMBOLS, *targets))


def apply(with_hooks: tuple | None = None) -> None:
    """Register the backend and install the hooks (``with_hooks``, default the plugin's own). Idempotent; every
    target is checked first."""
    global _applied
    from sglang_glm5.patches import backend, hooks

    with_hooks = _all_hooks() if with_hooks is None else with_hooks
    check_targets(with_hooks)
    backend.register()
    new = hooks.install(with_hooks)
    if not _applied or new:
        logger.info("sglang-glm5: plugin active (--moe-runner-backend %s)", BACKEND_NAME)
    _applied = True


def undo() -> None:
    """Remove the hooks and the backend name: SGLang is as it was before ``apply``."""
    global _applied
    from sglang_glm5.patches import backend, hooks, layers

    hooks.uninstall(_all_hooks())
    backend.unregister()
    layers.forget_kinds()
    _applied = False


def is_applied() -> bool:
    if not _applied:
        return False
    from sglang_glm5.patches import hooks

    return all(hooks.is_installed(h) for h in _all_hooks())


def plugin() -> None:
    """The ``sglang.srt.plugins`` entry point."""
    errors, warnings = env.problems()
    for line in warnings:
        logger.warning("sglang-glm5: %s", line)
    if guard.disabled():
        for line in errors:
            logger.error("sglang-glm5: %s", line)
        logger.info("sglang-glm5: %s is set, plugin off", guard.DISABLE_ENV)
        return
    if errors:
        # Checked here, at start-up, rather than when the first layer's weights load minutes later.
        message = "sglang-glm5: " + "; ".join(errors)
        logger.error(message)
        if guard.backend_requested():  # SystemExit passes through load_plugins(): the launcher stops here
            raise SystemExit(f"{message} (fix or unset it; --moe-runner-backend {BACKEND_NAME} reads it)")
    stock_configs.apply()
    version = guard.installed_sglang_version()
    if not guard.version_supported(version):
        reason = f"SGLang {version} is installed"
        logger.warning(
            "sglang-glm5: SGLang %s is not one of the tested versions (%s); plugin inactive, %s unavailable",
            version,
            ", ".join(SUPPORTED_SGLANG_VERSIONS),
            BACKEND_NAME,
        )
        _stop_if_requested(reason)
        return
    try:
        apply()
    except PatchTargetError as e:
        _stop_if_requested(str(e))
        raise


def _stop_if_requested(reason: str) -> None:
    # SystemExit passes through load_plugins() (it catches Exception): the launcher stops here,
    # before argument parsing would only say "invalid choice".
    if guard.backend_requested():
        raise SystemExit(guard.unavailable_message(reason))
