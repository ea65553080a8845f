"""Method hooks: resolved and checked before anything changes, idempotent, logged, undoable.

A hook is ``fn(original, *args, **kwargs)``. Installing it puts a wrapper on the owner class that
carries a marker attribute and ``__wrapped__`` (the original); a second install is a no-op and
``uninstall`` puts the original back. A target that is missing or whose parameters changed is a
``PatchTargetError`` naming the symbol, raised before any target is touched.
"""

from __future__ import annotations

import functools
import inspect
import logging
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sglang_glm5.patches.guard import SUPPORTED_SGLANG_VERSIONS

logger = logging.getLogger("sglang_glm5.patches")

MARKER = "__sglang_glm5_hook__"


class PatchTargetError(RuntimeError):
    """An SGLang symbol the plugin hooks or calls is missing or has another signature."""


@dataclass(frozen=True)
class Symbol:
    """An SGLang symbol the plugin relies on: dotted path, and its parameter names when callable."""

    path: str
    params: tuple[str, ...] | None = None

    def resolve(self) -> object:
        owner_path, _, attr = self.path.rpartition(".")
        try:
            owner = pkgutil.resolve_name(owner_path)
        except (ImportError, AttributeError, ValueError) as e:
            raise PatchTargetError(_moved(self.path, f"{owner_path} cannot be imported ({e})")) from e
        if not hasattr(owner, attr):
            raise PatchTargetError(_moved(self.path, f"{owner_path} has no attribute {attr!r}"))
        value = getattr(owner, attr)
        if self.params is not None:
            try:
                found = tuple(inspect.signature(value).parameters)
            except (TypeError, ValueError) as e:
                raise PatchTargetError(_moved(self.path, f"its signature cannot be read ({e})")) from e
            if found != self.params:
                raise PatchTargetError(_moved(self.path, f"expected parameters {self.params}, found {found}"))
        return value


@dataclass(frozen=True)
class MethodHook:
    """Wrap ``owner.attr`` (a plain function on a class, or inherited by it) with ``fn(original, *args, **kwargs)``.
    An inherited one is wrapped on ``owner`` alone, and uninstalling deletes the wrapper (the base's again)."""

    target: Symbol
    fn: Callable

    def owner_and_attr(self) -> tuple[type, str]:
        owner_path, _, attr = self.target.path.rpartition(".")
        return pkgutil.resolve_name(owner_path), attr


def check(symbols: Iterable[Symbol]) -> None:
    """Resolve every symbol; the first missing or changed one raises PatchTargetError."""
    for symbol in symbols:
        symbol.resolve()


def is_installed(hook: MethodHook) -> bool:
    owner, attr = hook.owner_and_attr()
    return getattr(owner.__dict__.get(attr), MARKER, False)


def install(hooks: Iterable[MethodHook]) -> int:
    """Install every hook not yet installed (all targets are checked first); returns how many were new."""
    hooks = list(hooks)
    check(h.target for h in hooks)
    new = 0
    for hook in hooks:
        owner, attr = hook.owner_and_attr()
        inherited = attr not in owner.__dict__
        original = getattr(owner, attr) if inherited else owner.__dict__[attr]
        if getattr(original, MARKER, False) and not inherited:
            continue
        wrapper = _wrap(original, hook.fn)
        wrapper._sglang_glm5_inherited = inherited
        setattr(owner, attr, wrapper)
        new += 1
        logger.info("sglang-glm5: hooked %s", hook.target.path)
    return new


def uninstall(hooks: Iterable[MethodHook]) -> int:
    """Put the originals back; returns how many hooks were removed."""
    removed = 0
    for hook in hooks:
        owner, attr = hook.owner_and_attr()
        current = owner.__dict__.get(attr)
        if getattr(current, MARKER, False):
            if getattr(current, "_sglang_glm5_inherited", False):
                delattr(owner, attr)
            else:
                setattr(owner, attr, current.__wrapped__)
            removed += 1
            logger.info("sglang-glm5: restored %s", hook.target.path)
    return removed


def _wrap(original: Callable, fn: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return fn(original, *args, **kwargs)

    wrapper.__wrapped__ = original
    setattr(wrapper, MARKER, True)
    return wrapper


def _moved(path: str, what: str) -> str:
    supported = ", ".join(SUPPORTED_SGLANG_VERSIONS)
    return f"SGLang symbol {path}: {what}; the sglang-glm5 hooks were written against SGLang {supported}"
