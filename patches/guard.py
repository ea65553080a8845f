"""What the plugin was tested against, and the switches that turn it off. Imports nothing heavy.

The SGLang versions the hooks were written and tested against live here and nowhere else.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence

from sglang_glm5 import env

BACKEND_NAME = "nvfp4_triton"  # the value of --moe-runner-backend that routes NVFP4 MoE layers to our op
SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)
# What SGLang 0.5.23 pins (torch==2.14.1 brings triton 3.8.0). Others are reported by `doctor`, not refused.
TESTED_TORCH_VERSIONS: tuple[str, ...] = ("2.14.1",)
TESTED_TRITON_VERSIONS: tuple[str, ...] = ("3.8.0",)
DISABLE_ENV = env.DISABLE.name
BACKEND_FLAGS = ("--moe-runner-backend", "--speculative-moe-runner-backend")


def disabled() -> bool:
    """True when SGLANG_GLM5_DISABLE is on; a value that is neither on nor off also counts as off for the
    plugin (it stays out of the way), and ``env.problems`` reports it (serve, doctor, the plugin's log)."""
    try:
        return bool(env.get(env.DISABLE))
    except env.EnvError:
        return True


def installed_sglang_version() -> str | None:
    """The installed SGLang distribution's version, read from its metadata (SGLang is not imported)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def version_supported(version: str | None) -> bool:
    return version in SUPPORTED_SGLANG_VERSIONS


def backend_requested(argv: Sequence[str] | None = None) -> bool:
    """True when the command line asks for our backend (``--moe-runner-backend nvfp4_triton`` or ``=...``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        for flag in BACKEND_FLAGS:
            if arg == f"{flag}={BACKEND_NAME}" or (arg == flag and i + 1 < len(args) and args[i + 1] == BACKEND_NAME):
                return True
    return False


def unavailable_message(reason: str) -> str:
    supported = ", ".join(SUPPORTED_SGLANG_VERSIONS)
    return (
        f"sglang-glm5: --moe-runner-backend {BACKEND_NAME} is not available: {reason}. "
        f"The plugin supports SGLang {supported}; install one of those, or choose another --moe-runner-backend."
    )
