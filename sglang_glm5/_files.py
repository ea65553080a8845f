"""JSON files that several processes may read and write at once (8 ranks tuning together)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock  # a dependency of torch itself

log = logging.getLogger("sglang_glm5.cache")


def read_json(path: Path) -> dict:
    """The file's object; raises ValueError (with the path) when it is not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_writable(path: Path, option: str, *, folder: bool = False) -> None:
    """ValueError naming ``option`` when ``path`` cannot become the file (``folder``: the folder) it names: it is a
    folder (a file), or the nearest existing parent is a file. Checked before long work that ends in the write."""
    if path.exists() and path.is_dir() != folder:
        raise ValueError(
            f"{option} {path}: a {'file' if folder else 'folder'}; expected a {'folder' if folder else 'file'}"
        )
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")


def update_json(path: Path, update: Callable[[dict], None]) -> dict:
    """Locked read-modify-write; the new file replaces the old one atomically (temp file + rename).

    A missing file starts from an empty object. A file that is not a JSON object is never silently
    replaced: it is renamed to ``NAME.corrupt-<UTC time>`` (logged as a warning), then a new one is written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        try:
            data = read_json(path)
        except FileNotFoundError:
            data = {}
        except ValueError as e:
            kept = keep_aside(path)
            log.warning("%s; kept it as %s and wrote a new one", e, kept.name)
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


def keep_aside(path: Path) -> Path:
    """Rename a broken file to ``NAME.corrupt-<UTC time>`` (a suffix added if that exists); the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    return target


def cache_dir() -> Path:
    """$SGLANG_GLM5_CACHE_DIR, default ~/.cache/sglang_glm5."""
    from sglang_glm5.env import cache_dir as from_env

    return from_env()


def check_cache_dir() -> None:
    """ValueError naming SGLANG_GLM5_CACHE_DIR when the cache folder cannot be made or written (checked before
    long work that ends in a write there: the tuned tiles, the memoized compiles)."""
    from sglang_glm5 import env

    folder = cache_dir()
    where = (f"{env.CACHE_DIR.name}={os.environ[env.CACHE_DIR.name]}" if os.environ.get(env.CACHE_DIR.name, "").strip()
             else f"the cache folder {folder} ({env.CACHE_DIR.name} unset)")  # fmt: skip
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{where}: a file, not a folder; point {env.CACHE_DIR.name} at a writable folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"{where}: cannot write there ({e.strerror or e}); point {env.CACHE_DIR.name} at a "
                         "writable folder") from None  # fmt: skip
