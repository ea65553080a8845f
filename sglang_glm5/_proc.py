"""How the package starts Python subprocesses (compile workers, Locust, SGLang's launcher)."""

from __future__ import annotations

import sys


def python_command(*args: str) -> list[str]:
    """``[this Python, "-P", *args]``. ``-P`` (Python 3.11+) keeps the current directory off ``sys.path``:
    ``python -m`` started in a source checkout's root would otherwise import its ``sglang_glm5/`` folder
    instead of the installed package (and SGLang's workers inherit that path)."""
    return [sys.executable, "-P", *args]
