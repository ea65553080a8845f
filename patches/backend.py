"""The backend name ``nvfp4_triton``, registered through SGLang's own extension APIs.

- ``add_moe_runner_backend_choices`` (``srt/arg_groups/choices.py``): the CLI choice list.
- ``register_moe_runner_core`` (``srt/layers/moe/moe_runner/runner.py``): registers the name, so that
  ``resolve_moe_runner_backend`` (``srt/layers/moe/utils.py``) knows it, and a runner-core factory.
  Our NVFP4 layers never build a MoeRunner (their ``apply`` calls our op), and layers of any other quantization
  are built with the stock backend (``layers``): the factory is a safeguard that names a layer if one still asks.
"""

from __future__ import annotations

import logging

from sglang_glm5.patches.guard import BACKEND_NAME
from sglang_glm5.patches.hooks import Symbol

logger = logging.getLogger("sglang_glm5.patches")

_CHOICES = "sglang.srt.arg_groups.choices"
_RUNNER = "sglang.srt.layers.moe.moe_runner.runner"
_UTILS = "sglang.srt.layers.moe.utils"

SYMBOLS = (
    Symbol(f"{_CHOICES}.add_moe_runner_backend_choices"),
    Symbol(f"{_CHOICES}.MOE_RUNNER_BACKEND_CHOICES"),
    Symbol(f"{_RUNNER}.register_moe_runner_core", ("backend_name", "factory")),
    Symbol(f"{_RUNNER}._CUSTOM_RUNNER_CORE_FACTORIES"),
    Symbol(f"{_UTILS}._REGISTERED_MOE_RUNNER_BACKEND_NAMES"),
    Symbol(f"{_UTILS}.resolve_moe_runner_backend", ("backend",)),
)


def refuse_other_layers(config) -> None:
    """Runner-core factory for MoE layers that are not ModelOpt NVFP4: fails at model construction."""
    raise NotImplementedError(
        f"--moe-runner-backend {BACKEND_NAME} runs only ModelOpt NVFP4 MoE layers (ModelOptNvFp4FusedMoEMethod); "
        f"MoE layer {getattr(config, 'layer_id', '?')} asked for a MoeRunner under that name, but the plugin builds "
        "layers of other quantizations with the stock backend (sglang_glm5.patches.layers). Serve this model with "
        "a stock --moe-runner-backend."
    )


def register() -> None:
    """Idempotent: adds the CLI choice and the runner name once."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.moe.moe_runner import runner

    if BACKEND_NAME not in choices.MOE_RUNNER_BACKEND_CHOICES:
        choices.add_moe_runner_backend_choices([BACKEND_NAME])
        logger.info("sglang-glm5: added --moe-runner-backend choice %s", BACKEND_NAME)
    if BACKEND_NAME not in runner._CUSTOM_RUNNER_CORE_FACTORIES:
        runner.register_moe_runner_core(BACKEND_NAME, refuse_other_layers)
        logger.info("sglang-glm5: registered MoE runner backend %s", BACKEND_NAME)


def unregister() -> None:
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.moe import utils
    from sglang.srt.layers.moe.moe_runner import runner

    while BACKEND_NAME in choices.MOE_RUNNER_BACKEND_CHOICES:
        choices.MOE_RUNNER_BACKEND_CHOICES.remove(BACKEND_NAME)
    runner._CUSTOM_RUNNER_CORE_FACTORIES.pop(BACKEND_NAME, None)
    utils._REGISTERED_MOE_RUNNER_BACKEND_NAMES.discard(BACKEND_NAME)
    logger.info("sglang-glm5: removed MoE runner backend %s", BACKEND_NAME)
