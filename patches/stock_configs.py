"""Point SGLang's Triton fused-MoE config lookup at SM120-feasible configs (BF16 / FP8 MoE models).

SGLang reads ``SGLANG_MOE_CONFIG_DIR`` lazily, when a MoE layer first runs (``get_moe_configs``), so
setting it from ``plugin()`` (launcher and every worker) is early enough; workers also inherit it.
Set only when asked for (``SGLANG_GLM5_STOCK_CONFIGS=1``), unset (a user's own value always wins), and
the GPUs are SM12x. Opt-in because the variable replaces SGLang's own config folder: its tuned
RTX PRO 6000 files for other models would no longer be found, while these configs are unmeasured.
Imports nothing heavy; the GPU is asked through NVML, which does not create a CUDA context.
"""

from __future__ import annotations

import logging
import os

from sglang_glm5 import env

ENV = "SGLANG_MOE_CONFIG_DIR"
SWITCH_ENV = env.STOCK_CONFIGS.name

logger = logging.getLogger("sglang_glm5.patches")


def enabled() -> bool:
    """SGLANG_GLM5_STOCK_CONFIGS is on (a value that is neither on nor off: off, reported by env.problems)."""
    try:
        return bool(env.get(env.STOCK_CONFIGS))
    except env.EnvError:
        return False


def detect_arch() -> int | None:
    """Compute capability (major * 10 + minor) shared by every GPU NVML sees; None when unknown or mixed."""
    try:
        import pynvml  # nvidia-ml-py, an SGLang dependency
    except ImportError:
        return _torch_arch()
    try:
        pynvml.nvmlInit()
        try:
            archs = set()
            for i in range(pynvml.nvmlDeviceGetCount()):
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
                archs.add(major * 10 + minor)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU
        return _torch_arch()
    return archs.pop() if len(archs) == 1 else None


def _torch_arch() -> int | None:
    # Only when CUDA is already initialized: never create a context just to ask.
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    from sglang_glm5.hardware import device_arch

    return device_arch()


def config_dir() -> str:
    from sglang_glm5.stock_configs import shipped_dir

    return str(shipped_dir())


def apply(arch: int | None = None) -> bool:
    """Set SGLANG_MOE_CONFIG_DIR to the shipped folder when allowed; True when it was set here.

    ``arch``: the GPU's compute capability (tests pass one); None asks the GPU.
    """
    if not enabled() or os.environ.get(ENV):
        return False
    if arch is None:
        arch = detect_arch()
    from sglang_glm5.hardware import is_sm12x

    if arch is None or not is_sm12x(arch):
        return False
    os.environ[ENV] = config_dir()
    logger.info(
        "sglang-glm5: %s=%s (SM120-feasible Triton MoE configs, unmeasured; asked for by %s=1)",
        ENV, os.environ[ENV], SWITCH_ENV,
    )  # fmt: skip
    return True
