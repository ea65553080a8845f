"""JSON files that several processes may read and write at once (8 ranks tuning together)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock  # a dependency of torch itself


def read_json(path: Path) -> dict:
    """The file's object; raises ValueError (with the path) when it is not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def update_json(path: Path, update: Callable[[dict], None]) -> dict:
    """Locked read-modify-write; the new file replaces the old one atomically (temp file + rename).

    A missing or unreadable file starts from an empty object, so a broken file is repaired, not kept.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        try:
            data = read_json(path)
        except (FileNotFoundError, ValueError):
            data = {}
        update(data)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return data


def cache_dir() -> Path:
    """$SGLANG_GLM5_CACHE_DIR, default ~/.cache/sglang_glm5."""
    from sglang_glm5.env import cache_dir as from_env

    return from_env()
